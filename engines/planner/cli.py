"""``kvstore-planner``: the SLO planner as its own process, beside the router. One flag per
:class:`~engines.planner.settings.PlannerSettings` field (``--ttft-target-s`` for
``ttft_target_s``), its help from the field's description and default.

A process of its own rather than a router option: it has its own life (it may stop, restart or
run in dry-run without touching serving), one planner can watch a router that several
replicas share, and its output (JSON lines, a metric) is for an autoscaler, not for clients.
A bad setting, or a router that does not answer at start, is one line naming the flag and exit
code 2; a router that stops answering later is retried every judgement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kvstore import cli_kit
from kvstore.cli_kit import CommandError
from kvstore.problems import problems

if TYPE_CHECKING:
    from engines.planner.loop import Planner

PROG = "kvstore-planner"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    from engines.planner.settings import PlannerSettings

    p = cli_kit.Parser(prog=PROG, description="The SLO planner: watches TTFT, ITL and queues "
                       "of the router's prefill and decode pools against targets and moves "
                       "workers between the roles (POST /admin/role), or prints a scale "
                       "recommendation (a JSON line) for an autoscaler.")
    cli_kit.add_version(p)
    for name, info in PlannerSettings.model_fields.items():
        default = info.get_default()
        shown = "none" if default is None else ("on" if default is True else "off"
                                                if default is False else default)
        text = info.description or ""
        if not info.is_required():
            text += f" (default: {shown})"
        options: dict[str, Any] = {"dest": name, "default": None, "help": text}
        if info.annotation is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["metavar"] = ("PATH" if name.endswith("_file") else "URL"
                                  if name in ("router", "kvstore") else "N"
                                  if info.annotation is int else "X")
            options["required"] = info.is_required()
        if name in ("router", "kvstore"):
            options["type"] = cli_kit.url_arg  # http:// may be left out, as for every command
        p.add_argument(flag_of(name), **options)
    return p


def settings_from(args: argparse.Namespace) -> Any:
    from engines.planner.settings import PlannerSettings

    given = {k: v for k, v in vars(args).items() if v is not None}
    try:
        return PlannerSettings(**given)
    except ValidationError as exc:
        parts = [f"{flag_of(err.field)}: {err.msg}" if err.field else err.msg
                 for err in problems(exc)]
        raise CommandError("invalid settings: " + "; ".join(parts)) from None


def run(args: argparse.Namespace) -> int:
    from engines.planner.loop import Planner
    from engines.planner.metrics import PlannerMetrics

    settings = settings_from(args)
    token = _token(settings.token_file, "token_file")
    kvstore_token = _token(settings.kvstore_token_file, "kvstore_token_file")
    metrics = PlannerMetrics()
    if settings.metrics_port:
        try:
            metrics.serve(settings.metrics_port)
        except OSError as exc:
            raise CommandError(f"--metrics-port {settings.metrics_port}: {exc.strerror}; "
                               "choose another port") from None
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_plan(Planner(settings, token, metrics=metrics,
                                  kvstore_token=kvstore_token)))
    return 0


def _token(path: str | None, name: str) -> str | None:
    """The token in the file at ``path`` (None: no file); one line naming the flag if it
    cannot be read."""
    from server.token_files import read_token_file

    try:
        return read_token_file(path) if path else None
    except ValueError as exc:
        raise CommandError(f"{flag_of(name)}: {exc}") from None


async def _plan(planner: Planner) -> None:
    """Run ``planner`` once the router has answered; a :class:`CommandError` when it does
    not answer at start (later failures are the loop's to retry)."""
    import httpx

    try:
        await planner.connect()
    except httpx.HTTPError as exc:
        await planner.client.aclose()
        raise CommandError(_unreachable(planner.s.router, exc)) from None
    await planner.run()


def _unreachable(router: str, exc: Exception) -> str:
    """Why the router did not answer the first look, in one line, and what to do."""
    import httpx

    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        fix = ("give the fleet's token with --token-file" if status in (401, 403)
               else "is --router a kvstore-router?")
        return (f"--router {router}: GET /stats answered {status} "
                f"{exc.response.reason_phrase}; {fix}")
    why = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, httpx.TransportError):
        return (f"--router {router}: cannot reach the router ({why}); start kvstore-router "
                "there or fix --router")
    return f"--router {router}: {why}; is --router a kvstore-router?"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return cli_kit.run(PROG, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
