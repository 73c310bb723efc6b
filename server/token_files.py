"""Bearer tokens read from files (``token_file``, ``tenant_tokens_file``,
``cluster_token_file``), so that secrets stay
out of the process list: a flag's value is in ``/proc/<pid>/cmdline``, which every local user
may read, while a file can be mode 0600 and ``KVSTORE_*`` variables are readable only by the
same user and root."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _read(path: Any, key: str) -> str:
    try:
        text = Path(str(path)).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    return text.strip()


def read_token_file(path: Any) -> str:
    """The one bearer token in file ``path`` (the same rules for every command that takes a
    ``--token-file``). Raises ``ValueError`` naming the file and the problem."""
    try:
        token = Path(str(path)).expanduser().read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not token or any(c.isspace() for c in token):
        raise ValueError(f"{path} must hold one token (no spaces), got "
                         f"{'nothing' if not token else 'several words'}")
    return token


def _single_token(path: Any, key: str = "token_file") -> str:
    try:
        return read_token_file(path)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _cluster_token(path: Any) -> str:
    return _single_token(path, "cluster_token_file")


def _tenant_tokens(path: Any) -> dict[str, str]:
    try:
        doc = json.loads(_read(path, "tenant_tokens_file"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"tenant_tokens_file: {path} is not JSON: {exc.msg}") from None
    if not isinstance(doc, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in doc.items()):
        raise ValueError(f"tenant_tokens_file: {path} must hold a JSON object tenant -> token, "
                         'e.g. {"a": "secret-a"}')
    return doc


def fill_tokens_from_files(data: Any) -> Any:
    """``data`` (the settings' raw input) with ``token``, ``tenant_tokens`` and
    ``cluster_token`` read from the files that ``token_file``, ``tenant_tokens_file`` and
    ``cluster_token_file`` name. Raises ``ValueError`` when a
    secret is given both ways, or a file is missing or malformed."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for file_key, key, read in (("token_file", "token", _single_token),
                                ("tenant_tokens_file", "tenant_tokens", _tenant_tokens),
                                ("cluster_token_file", "cluster_token", _cluster_token)):
        path = out.get(file_key)
        if path is None:
            continue
        if out.get(key) is not None:
            raise ValueError(f"set {key} or {file_key}, not both")
        out[key] = read(path)
    return out
