"""Checks before a server takes something another process may own or the machine may not
have: its ports (bound before anything is announced), its Unix socket path (only a stale
socket is removed, never a file, a folder or a live socket), its data dir, the memory for the
host tier and the device of the device tier. A refusal is a :class:`StartupError`: one line
naming the setting and what to do, and exit code 2, before the store is opened."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import stat
from typing import TYPE_CHECKING

from pydantic import ByteSize

from kvstore.cli_kit import CommandError, bind_tcp
from kvstore.tiers.segment import memory_available

if TYPE_CHECKING:
    from server.settings import ServerSettings

log = logging.getLogger("kvstore.server")

__all__ = ["StartupError", "bind_tcp", "check_data_dir", "check_device", "check_extras",
           "check_memory", "claim_socket_path"]


class StartupError(CommandError):
    """The server must not start: a resource it needs belongs to someone else, or a setting
    asks for what this machine does not have."""


def _human(n: int) -> str:
    return ByteSize(n).human_readable()


def check_data_dir(path: os.PathLike[str] | str) -> None:
    """Make the data dir (mode 0700), or refuse one that is a file or cannot be made."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise StartupError(f"data dir {path} exists and is not a folder; choose another "
                           "--data-dir") from None
    except PermissionError as exc:
        raise StartupError(f"cannot create data dir {path} ({exc.strerror}); choose another "
                           "--data-dir") from None


def check_memory(settings: ServerSettings) -> None:
    """Refuse a host tier larger than the memory this machine (or its cgroup) has free: the
    slab is reserved in full at start, and reserving more than there is ends in the kernel's
    OOM killer, not in an error."""
    want = settings.host_capacity
    room = memory_available()
    if want and room is not None and want > room:
        raise StartupError(f"host_capacity {_human(want)} is more than the memory available "
                           f"({_human(room)}); lower --host-capacity")


def check_extras(settings: ServerSettings) -> None:
    """Refuse a tier whose package this install lacks, naming the extra that brings it: a plain
    ``pip install kvstore`` is the runtime only, and its tiers import their packages lazily."""
    wanted = []
    if settings.device_capacity:
        wanted.append(("torch", "the device tier (--device-capacity)", "gpu"))
    if settings.s3_bucket is not None:
        wanted.append(("boto3", "the S3 tier (--s3-bucket)", "s3"))
    for module, what, extra in wanted:
        if importlib.util.find_spec(module) is None:
            raise StartupError(f"{what} needs {module}, which this install lacks: "
                               f"pip install 'kvstore[{extra}]'")


def check_device(settings: ServerSettings) -> None:
    """Refuse a device tier on a device torch cannot use (no CUDA, no such GPU)."""
    if not settings.device_capacity or settings.device == "cpu":
        return
    import torch

    try:
        device = torch.device(settings.device)
    except RuntimeError:
        raise StartupError(f"device {settings.device!r} is not a torch device; set --device "
                           "to cpu or cuda:N") from None
    if device.type != "cuda":
        return
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "built with CUDA"
        raise StartupError(f"device {settings.device}: torch {torch.__version__} ({build}) sees "
                           "no CUDA device; use --device cpu, or --device-capacity 0 for no "
                           "device tier")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise StartupError(f"device {settings.device}: torch sees {count} CUDA device(s); "
                           f"choose --device cuda:0 to cuda:{count - 1}")


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
