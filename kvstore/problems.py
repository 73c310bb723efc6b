"""What pydantic found wrong with a document, read once into typed :class:`Problem` rows, so
that every place that reports a validation error (the command lines' settings, the connector's
extra config, a server's ``/v1/info``, a worker's 400) names the field the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol


class HasErrors(Protocol):
    """``pydantic.ValidationError`` or FastAPI's ``RequestValidationError``."""

    def errors(self) -> Sequence[Any]: ...


class Problem(NamedTuple):
    """One error: ``loc`` the path of keys to the bad value, ``kind`` pydantic's error type
    (``missing``, ``extra_forbidden``, ``byte_size``...), ``msg`` its message without the
    ``Value error,`` that pydantic puts before a validator's own, and the value given."""

    loc: tuple[str | int, ...]
    kind: str
    msg: str
    given: Any

    @property
    def field(self) -> str:
        """The top-level field the error is about ("" for the document as a whole)."""
        return str(self.loc[0]) if self.loc else ""

    def where(self, skip: tuple[str, ...] = ()) -> str:
        """The path as ``a.b.0``, without the parts in ``skip`` (FastAPI's ``body``)."""
        return ".".join(str(p) for p in self.loc if p not in skip)


def problems(exc: HasErrors) -> list[Problem]:
    """Every error of ``exc``, in pydantic's order."""
    return [Problem(tuple(e["loc"]), str(e["type"]), str(e["msg"]).removeprefix("Value error, "),
                    e.get("input")) for e in exc.errors()]
