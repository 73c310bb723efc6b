"""Checks before a server takes something another process may own, such as its Unix socket
path (only a stale socket is removed, never a file, a folder or a live socket). A refusal is a
:class:`StartupError`: one line and exit code 2, before the store is opened."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat

log = logging.getLogger("kvstore.server")


class StartupError(Exception):
    """The server must not start: a resource it needs belongs to someone else."""


def claim_socket_path(path: str) -> None:
    """Make ``path`` free for our Unix socket: nothing there, or a stale socket (one nobody
    listens on), which is removed. Raises :class:`StartupError` for a live socket or for
    anything that is not a socket (a file, a folder): those are never removed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"unix socket path {path} exists and is not a socket; "
                           "remove it or choose another --unix-socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2.0)
        try:
            probe.connect(path)
        except FileNotFoundError:
            return
        except ConnectionRefusedError:
            pass  # nobody listens: a socket a dead server left
        except OSError as exc:
            raise StartupError(f"cannot tell whether unix socket {path} is in use ({exc}); "
                               "remove it or choose another --unix-socket") from None
        else:
            raise StartupError(f"unix socket {path} is in use by a live process; "
                               "choose another --unix-socket")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("removed stale unix socket %s", path)
