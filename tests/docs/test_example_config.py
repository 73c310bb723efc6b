"""``docs/kvstore.example.yaml`` is a config file with every setting of ``kvstore serve``, each
with its default and its description as a comment, grouped as ``server/settings.py`` groups
them. This test loads it as ``kvstore serve --config`` does and checks that it names every
setting, in the model's order, at its default, under its description, so that it cannot rot
when a setting is added or changed. After changing the settings, rewrite the file with
``python tests/docs/test_example_config.py``."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ByteSize
from pydantic.fields import FieldInfo

from server.settings import ServerSettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "kvstore.example.yaml"
SETTINGS_SOURCE = ROOT / "server" / "settings.py"
HEAD = """\
# kvstore serve: every setting, at its default, with what it means. Use it as
#   kvstore serve --config kvstore.yaml      (or KVSTORE_CONFIG=kvstore.yaml)
# keeping only the lines you change. A KVSTORE_* variable beats the file and a flag beats
# both (docs/operations.md, "Configuration"). Sizes take bytes or units: 4096, 512MiB, 10GiB,
# 1.5GB. Secrets: prefer token_file and tenant_tokens_file (mode 0600) to token and
# tenant_tokens here.
#
# Generated from server/settings.py by `python tests/docs/test_example_config.py`;
# tests/docs/test_example_config.py checks it against the settings.
"""
_UNITS = (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10))


def default_of(info: FieldInfo) -> Any:
    return info.get_default(call_default_factory=True)


def as_yaml(info: FieldInfo) -> str:
    """A default as a YAML value: sizes in the largest unit that holds them exactly."""
    value = default_of(info)
    if info.annotation is ByteSize and value:
        for unit, shift in _UNITS:
            if value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def groups() -> dict[str, str]:
    """Setting -> the title of the group it is declared in (the ``# -- title --`` comments of
    :class:`ServerSettings`)."""
    out: dict[str, str] = {}
    title = ""
    for line in SETTINGS_SOURCE.read_text(encoding="utf-8").splitlines():
        if match := re.match(r"^    # -- (.+?) -+$", line):
            title = re.sub(r"\s*\(issue \d+\)", "", match.group(1))
        elif (match := re.match(r"^    (\w+): ", line)) and match.group(1) in \
                ServerSettings.model_fields:
            out[match.group(1)] = title
    return out


def render() -> str:
    lines = [HEAD.rstrip("\n")]
    titles = groups()
    current = None
    for name, info in ServerSettings.model_fields.items():
        if titles.get(name) != current:
            current = titles.get(name)
            lines += ["", f"# -- {current} ".ljust(98, "-")]
        lines.append("")
        lines += textwrap.wrap(" ".join((info.description or "").split()), 96,
                               initial_indent="# ", subsequent_indent="# ")
        lines.append(f"{name}: {as_yaml(info)}")
    return "\n".join(lines) + "\n"


def comments_above(text: str) -> dict[str, str]:
    """Each top-level key of the file -> the comment block right above it, as one line."""
    out: dict[str, str] = {}
    block: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            block.append(line.lstrip("#").strip())
        elif match := re.match(r"^(\w+):", line):
            out[match.group(1)] = " ".join(" ".join(block).split())
            block = []
        else:
            block = []
    return out


@pytest.fixture
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("KVSTORE_")]:
        monkeypatch.delenv(name)


def test_example_config_loads_and_holds_every_setting_at_its_default(
        no_environment: None) -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    fields = ServerSettings.model_fields
    missing = [n for n in fields if n not in doc]
    assert not missing, (
        f"docs/kvstore.example.yaml lacks {missing}: run `python tests/docs/"
        "test_example_config.py` (or add them by hand, with their description) and commit it")
    assert list(doc) == list(fields), "the settings are not in the model's order (its groups)"

    loaded = load_settings(EXAMPLE)  # what `kvstore serve --config` does with the file
    defaults = load_settings()
    for name, info in fields.items():
        assert getattr(loaded, name) == getattr(defaults, name) == default_of(info), name

    described = comments_above(text)
    for name, info in fields.items():
        assert " ".join((info.description or "").split()) in described[name], (
            f"{name}: its comment in docs/kvstore.example.yaml is not its description")


def test_operators_are_pointed_at_the_example() -> None:
    for doc in ("README.md", "docs/operations.md"):
        assert "docs/kvstore.example.yaml" in (ROOT / doc).read_text(encoding="utf-8"), doc


if __name__ == "__main__":
    EXAMPLE.write_text(render(), encoding="utf-8")
    sys.exit(0)
