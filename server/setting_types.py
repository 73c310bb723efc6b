"""The value types of the server's settings (:mod:`server.settings`): sizes with units, log
levels and lists of names, each as a flag, a ``KVSTORE_*`` variable and a YAML value give it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ByteSize, SecretStr
from pydantic_settings import NoDecode


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML's yes/no, or a flag mixed up with a switch
        raise ValueError(f"not a size: {value!r}")
    return value


# bytes, or a number with a unit: 4096, 512MiB, 10GiB, 1.5GB (parsed by pydantic's ByteSize;
# kept as a plain int, which is what type checkers see)
if TYPE_CHECKING:
    Size = int
else:
    Size = Annotated[ByteSize, BeforeValidator(_refuse_bool), AfterValidator(int)]
LogLevel = Literal["critical", "error", "warning", "info", "debug"]


def _names(value: Any) -> Any:
    """A comma-separated string (a flag, a variable) as a list; a YAML list as it is."""
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


Names = Annotated[list[str], NoDecode, BeforeValidator(_names)]


def _token(value: Any) -> Any:
    """Without the newline that a secret mounted as a variable often ends with (a token file is
    stripped too; an HTTP header cannot carry it, so the token would never match); an empty
    token, or one of several words, is refused rather than matching nothing."""
    if isinstance(value, str):
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError("a token must be one word: not empty, no spaces")
    return value


Token = Annotated[SecretStr, BeforeValidator(_token)]


def lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value
