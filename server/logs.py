"""How ``kvstore serve`` logs: one format for every line the process writes, kvstore's own,
uvicorn's and the opt-in access log, as text or as one JSON object a line (``log_format``).

JSON lines carry ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, plus the
record's own fields (``extra=``) such as the start banner's URLs and capacities; the formatter
is python-json-logger's. uvicorn is given no logging config of its own, so that its records
reach these handlers too.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.json import JsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str, fmt: str) -> None:
    """Send every logger's records to stderr at ``level``, formatted as ``fmt`` (text or
    json). Replaces any handler set before (uvicorn's, an earlier call's)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(
            "{asctime}{levelname}{name}{message}", style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            datefmt="%Y-%m-%dT%H:%M:%S%z", defaults={}))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    if root.level > logging.DEBUG:
        handler.addFilter(_quiet_uvicorn)


def _quiet_uvicorn(record: logging.LogRecord) -> bool:
    """Drop uvicorn's own start and stop lines ("Started server process", "Shutting down"):
    the banner and the stop line say it once; its warnings and errors pass."""
    return not (record.name == "uvicorn.error" and record.levelno < logging.WARNING)


def announce(text: str, fmt: str, **fields: Any) -> None:
    """Say ``text`` (the start banner, the shutdown's summary) whatever the log level: as it
    is in text, as one JSON line with ``fields`` in json."""
    if fmt != "json":
        print(text, file=sys.stderr, flush=True)
        return
    record = logging.LogRecord("kvstore.server", logging.INFO, __file__, 0,
                               " ".join(text.split()), None, None)
    record.__dict__.update(fields)
    for handler in logging.getLogger().handlers:
        handler.handle(record)
