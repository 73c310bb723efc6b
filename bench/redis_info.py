"""What the cluster benches read from a throwaway Redis (``INFO``), summed over the servers
of a Redis Cluster: memory in use, main-thread CPU seconds and calls per command.

``redis-cli`` answers each read (a few ms): fine between measured phases, never inside one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvstore.testing.redis_server import RedisServer


class RedisSample(NamedTuple):
    """One reading of one or more Redis servers, summed."""

    memory: int  # bytes, ``used_memory``
    cpu_s: float  # main thread, user + system
    calls: dict[str, int]  # command name (lower case) -> calls so far

    def since(self, before: RedisSample) -> RedisSample:
        """What happened between ``before`` and this reading."""
        calls = {c: n - before.calls.get(c, 0) for c, n in self.calls.items()}
        return RedisSample(self.memory - before.memory, self.cpu_s - before.cpu_s,
                           {c: n for c, n in calls.items() if n})

    def total_calls(self) -> int:
        return sum(self.calls.values())


def _fields(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition(":")
        if sep:
            out[name] = value
    return out


def sample(servers: Sequence[RedisServer]) -> RedisSample:
    """``INFO memory``, ``cpu`` and ``commandstats`` of ``servers``, summed. Scripts' inner
    calls (``HGET`` in ``EVALSHA``) count under their own names as well as the script's."""
    memory, cpu = 0, 0.0
    calls: dict[str, int] = {}
    for server in servers:
        info = _fields(server.cli("info", "everything"))
        memory += int(info.get("used_memory", 0))
        cpu += float(info.get("used_cpu_user_main_thread", 0)) + \
            float(info.get("used_cpu_sys_main_thread", 0))
        for name, value in info.items():
            if name.startswith("cmdstat_"):
                n = int(value.split("calls=")[1].split(",")[0])
                calls[name[8:]] = calls.get(name[8:], 0) + n
    return RedisSample(memory, cpu, calls)
