"""What ``kvstore serve`` says once it serves, and once it stopped: where to reach it (REST,
dashboard, metrics, the data plane), where its data lies, each tier's capacity and what it
found there at the start; at the end, what the close wrote or lost."""

from __future__ import annotations

from typing import Any

from pydantic import ByteSize

from kvstore.protocol.info import ServerInfo
from kvstore.protocol.stats import StoreStats
from server.settings import ServerSettings


def _size(n: int) -> str:
    return ByteSize(n).human_readable()


def start(settings: ServerSettings, info: ServerInfo, stats: StoreStats,
          cluster: str | None) -> tuple[str, dict[str, Any]]:
    """The start banner as text lines, and the same as fields (for a JSON log line). It
    begins ``kvstore serving``: scripts and the docs look for it."""
    rest = f"http://{settings.host}:{settings.port}"
    data = []
    if settings.data_port:
        data.append(f"tcp {settings.host}:{settings.data_port}")
    if settings.socket_path:
        data.append(f"unix {settings.socket_path}")
    if info.shm:
        data.append(f"shared memory {info.shm.name or 'memfd'}")
    tiers = {name: {"capacity_bytes": t.capacity_bytes, "blocks": t.blocks, "bytes": t.bytes}
             for name, t in stats.tiers.items()}
    held = ", ".join(f"{name} {_size(t.capacity_bytes)}"
                     + (f" ({t.blocks} blocks, {_size(t.bytes)} found)" if t.blocks else "")
                     for name, t in stats.tiers.items())
    lines = [f"kvstore serving REST {rest} (version {info.version})",
             f"  dashboard {rest}/dashboard   metrics {rest}/metrics   health {rest}/healthz",
             f"  data plane {', '.join(data) or 'off'}",
             f"  data dir {settings.data_dir}",
             f"  tiers {held or 'none'}"]
    if cluster:
        lines.append(f"  cluster {cluster}")
    fields = {"event": "serving", "version": info.version, "rest": rest,
              "dashboard": f"{rest}/dashboard", "metrics": f"{rest}/metrics",
              "data_plane": data, "data_dir": str(settings.data_dir), "tiers": tiers,
              "cluster": cluster}
    return "\n".join(lines), fields


def stopped(lost: int, written: int, stats: StoreStats | None) -> tuple[str, dict[str, Any]]:
    """The one line a stop ends with: what each tier held as the store closed (``stats``,
    taken just before), how many memory-only blocks the close wrote to disk (``written``)
    and how many it could not (``lost``)."""
    held = {name: t.blocks for name, t in (stats.tiers.items() if stats else ())}
    shown = ", ".join(f"{name} {blocks}" for name, blocks in held.items()) or "none"
    wrote = f"{written} memory-only blocks written to disk"
    text = (f"kvstore stopped: store closed and synced, {wrote} (held at the stop: {shown})"
            if not lost else f"kvstore stopped: {wrote}, {lost} could not be written to disk "
            f"and are lost (held at the stop: {shown})")
    return text, {"event": "stopped", "written_blocks": written, "lost_blocks": lost,
                  "blocks_held": held}
