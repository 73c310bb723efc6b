"""``kvstore serve``: one flag per :class:`~server.settings.ServerSettings` field, generated
from the field (``--host-capacity`` for ``host_capacity``, its help from the field's
description and default); a flag left out falls back to ``KVSTORE_*`` and then the YAML file.

A setting that is wrong, or that this machine cannot honour, stops the server before it says it
is serving: one line naming the setting and what to do, exit code 2 (see
:class:`server.preflight.StartupError`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import typing
from collections.abc import Collection
from typing import Any

from pydantic import ByteSize, ValidationError
from pydantic.fields import FieldInfo

from kvstore.cli_kit import closest
from kvstore.problems import problems

# never echo their values in an error
SECRETS = ("token", "tenant_tokens", "cluster", "cluster_token")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def shown_default(info: FieldInfo) -> str:
    """A field's default as ``--help`` shows it: sizes human-readable, switches on/off."""
    value = info.get_default(call_default_factory=True)
    if value is None or value == {} or value == []:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if info.annotation is ByteSize:
        return ByteSize(value).human_readable()
    return str(value)


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None


def settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field. Every default is None, so that a flag left out does not
    hide the environment or the YAML file; the help says what the default is."""
    from server.settings import ServerSettings

    for name, info in ServerSettings.model_fields.items():
        text = (f"{info.description} (default: {shown_default(info)}; env "
                f"KVSTORE_{name.upper()})").replace("%", "%%")
        kind = info.annotation
        if kind is bool:
            parser.add_argument(flag_of(name), dest=name, default=None, help=text,
                                action=argparse.BooleanOptionalAction)
            continue
        options: dict[str, Any] = {"dest": name, "default": None, "help": text}
        if typing.get_origin(kind) is dict:
            options["type"] = _json_arg
        elif kind is ByteSize:
            options["metavar"] = "SIZE"
        elif typing.get_origin(kind) is typing.Literal:
            options["metavar"] = "{" + ",".join(typing.get_args(kind)) + "}"
        parser.add_argument(flag_of(name), **options)


def invalid_settings(exc: ValidationError, config: str | None = None,
                     given: Collection[str] = ()) -> str:
    """One line for every problem pydantic found, each naming the setting's flag and
    variable, and the YAML file ``config`` where the value came from it (a setting not in
    ``given``, the flags, nor in the environment); an unknown key of the file with the
    setting it is closest to."""
    from server.settings import ServerSettings

    fields = ServerSettings.model_fields
    parts = []
    for err in problems(exc):
        name, msg = err.field, err.msg
        if err.kind == "extra_forbidden":  # only the file can name a setting that is none
            close = closest(name, fields)
            parts.append(f"unknown setting {name!r} in config file {config} " + (
                f"(did you mean {close!r}?)" if close else "(see kvstore serve --help)"))
            continue
        if err.kind.startswith("byte_size"):
            msg += "; use bytes or a size such as 4096, 512MiB, 10GiB, 1.5GB"
        if name not in fields:
            parts.append(msg)
            continue
        given_value = err.given
        if name not in SECRETS and isinstance(given_value, str | int | float) \
                and str(given_value) not in msg:
            msg += f" (got {given_value!r})"
        source = ""
        if config and name not in given and f"KVSTORE_{name.upper()}" not in os.environ:
            source = f" in config file {config}"
        parts.append(f"{name} ({flag_of(name)}, KVSTORE_{name.upper()}){source}: {msg}")
    return "invalid settings: " + "; ".join(parts)


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the kvstore server (REST + data plane)",
                       description="Run the kvstore server. Each setting is a flag, a "
                       "KVSTORE_* variable and a key of the YAML file; a flag beats the "
                       "environment, which beats the file.")
    p.add_argument("--config", default=None, metavar="PATH",
                   help="YAML settings file (env KVSTORE_CONFIG)")
    settings_flags(p)
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from server.logs import configure as configure_logs
    from server.preflight import StartupError
    from server.runtime import loop_factory, serve
    from server.settings import ConfigFileError, ServerSettings, load_settings

    flags = {k: getattr(args, k) for k in ServerSettings.model_fields if hasattr(args, k)}
    try:
        settings = load_settings(args.config, **flags)
    except ValidationError as exc:
        config = args.config or os.environ.get("KVSTORE_CONFIG")
        given = [k for k, v in flags.items() if v is not None]
        raise StartupError(invalid_settings(exc, config, given)) from None
    except (FileNotFoundError, ConfigFileError) as exc:
        raise StartupError(f"{exc}; fix --config (KVSTORE_CONFIG)") from None
    configure_logs(settings.log_level, settings.log_format)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(serve(settings))
