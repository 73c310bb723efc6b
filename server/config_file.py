"""The YAML config file of ``kvstore serve``: refused unless it is a YAML mapping (a syntax
error named with its place), then read as the settings' last source, below the flags and the
``KVSTORE_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import yaml
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, YamlConfigSettingsSource

# the file the settings being built read; a context variable, so that concurrent loads in
# other threads or tasks each read their own
_yaml_path: ContextVar[str | None] = ContextVar("kvstore_yaml_path", default=None)


class ConfigFileError(ValueError):
    """The YAML config file cannot be read as settings: not YAML, or not a mapping."""


def _check_yaml(path: str | os.PathLike[str]) -> None:
    """Refuse a config file that is not a YAML mapping, with the place of a syntax error."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigFileError(f"config file {path} is not valid YAML: {exc.problem}{where}") \
            from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"config file {path} is not valid YAML: {exc}") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigFileError(f"config file {path} must be a mapping of settings (key: value "
                              f"lines), not a YAML {type(doc).__name__}")


@contextmanager
def reading(path: str | os.PathLike[str] | None) -> Iterator[None]:
    """Settings built inside read the file at ``path`` (None: no file). Raises
    ``FileNotFoundError`` for a missing file and :class:`ConfigFileError` for one that is not
    a YAML mapping."""
    if path is not None:
        if not Path(path).is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        _check_yaml(path)
    token = _yaml_path.set(str(path) if path is not None else None)
    try:
        yield
    finally:
        _yaml_path.reset(token)


def yaml_sources(settings_cls: type[BaseSettings]) -> tuple[PydanticBaseSettingsSource, ...]:
    """The file being read (see :func:`reading`) as a settings source, or none."""
    path = _yaml_path.get()
    if path is None:
        return ()
    return (YamlConfigSettingsSource(settings_cls, yaml_file=path),)
