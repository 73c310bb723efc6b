"""Traffic for a running ``kvstore serve``: a thread of a real client that keeps putting,
getting, prefetching and pinning blocks in a few namespaces, so that every counter moves (hits
in the top tier and below it, misses, evictions, demotions, bytes in and out, pins).

Used by the metrics, dashboard and Grafana tests; run it by hand to watch ``/dashboard`` move:
``python -m kvstore.testing.traffic [--url 127.0.0.1:8470] [--token T]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvstore.cli_client import default_url
from kvstore.cli_kit import url_arg
from kvstore.client import KVStoreClient
from kvstore.testing.seaweed import SeaweedServer
from kvstore.testing.server import ServerProc
from kvstore.types import BlockHash

BLOCK = 16384  # bytes per block: small, so that a few MiB of tier fill and evict


class Traffic:
    """Rounds of traffic over ``namespaces``; each round puts ``fresh`` new blocks per
    namespace, gets a mix of recent blocks (hits), old ones (some evicted: misses) and unknown
    ones (misses), prefetches a few and pins two for ``pin_s``, releasing its oldest pins past
    ``max_pins`` per namespace (a tenant's pins count against its quota)."""

    def __init__(self, url: str, token: str | None = None, *,
                 namespaces: tuple[str, ...] = ("chat", "code"), fresh: int = 8,
                 pause_s: float = 0.05, pin_s: float = 30.0, max_pins: int = 12,
                 seed: int = 0) -> None:
        self.client = KVStoreClient(url, token, transport="tcp")
        self.namespaces, self.fresh, self.pause_s, self.pin_s = namespaces, fresh, pause_s, pin_s
        self.rounds = 0
        self.error: BaseException | None = None
        self._rng = random.Random(seed)
        self._stored: dict[str, list[BlockHash]] = {ns: [] for ns in namespaces}
        self._pinned: dict[str, list[BlockHash]] = {ns: [] for ns in namespaces}
        self.max_pins = max_pins
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstore-traffic", daemon=True)
        self._payload = os.urandom(BLOCK)

    def start(self) -> Traffic:
        for ns in self.namespaces:
            self.client.register_namespace(ns, BLOCK, {"model_id": f"traffic-{ns}"})
        self._thread.start()
        return self

    def round(self) -> None:
        """One round over every namespace (also callable without the thread)."""
        for i, ns in enumerate(self.namespaces):
            stored = self._stored[ns]
            hashes = [BlockHash(os.urandom(32)) for _ in range(self.fresh)]
            self.client.put(ns, hashes, [self._payload] * len(hashes))
            stored.extend(hashes)
            recent = stored[-4 * self.fresh:]
            # namespaces differ in reuse, so that their hit rates differ
            wanted = self._rng.sample(recent, min(len(recent), self.fresh * (2 - i % 2)))
            wanted += self._rng.sample(stored, min(len(stored), self.fresh // 2))
            wanted += [BlockHash(os.urandom(32)) for _ in range(self.fresh // 4 + i)]
            self.client.get(ns, wanted)
            self.client.prefetch(ns, self._rng.sample(stored, min(len(stored), 2)))
            self._pin(ns, hashes[:2])
        self.rounds += 1

    def _pin(self, ns: str, hashes: list[BlockHash]) -> None:
        pinned = self._pinned[ns]
        self.client.pin(ns, hashes, self.pin_s)
        pinned.extend(hashes)
        if len(pinned) > self.max_pins:
            old = pinned[:len(pinned) - self.max_pins]
            del pinned[:len(old)]
            self.client.release(ns, old)

    def wait_rounds(self, n: int, timeout_s: float = 60.0) -> None:
        """Block until ``n`` rounds are done (RuntimeError on a traffic error or timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.rounds < n:
            if self.error is not None:
                raise RuntimeError(f"traffic failed: {self.error!r}") from self.error
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self.rounds} of {n} traffic rounds in {timeout_s} s")
            time.sleep(0.05)

    def halt(self) -> None:
        """Stop sending; the client stays connected, so its pins stay."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def stop(self) -> None:
        """Stop sending and close the client (the server then drops its pins)."""
        self.halt()
        self.client.close()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.round()
                self._stop.wait(self.pause_s)
        except BaseException as exc:  # reported by wait_rounds
            self.error = exc


@contextlib.contextmanager
def busy_server(root: Path, *flags: str, token: str | None = None, s3: bool = True,
                **traffic: Any) -> Iterator[tuple[ServerProc, Traffic]]:
    """A ``kvstore serve`` with small host and disk tiers (128 blocks each) over an S3 tier on
    a throwaway SeaweedFS (unless ``s3`` is False), and :class:`Traffic` running against it;
    everything stops on exit. ``flags`` go to ``kvstore serve``."""
    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        args = ["--host-slot-bytes", str(BLOCK), *flags]
        if token is not None:
            args += ["--token", token]
        if s3:
            weed = SeaweedServer(root / "weed", access_key=f"kv{secrets.token_hex(4)}",
                                 secret_key=secrets.token_hex(16), bucket="kvstore-busy")
            stack.callback(weed.stop)
            weed.start()
            s3_args, env = weed.serve_args()
            args += s3_args
        server = ServerProc(root / "data", *args, env=env, host_capacity="2MiB",
                            disk_capacity="2MiB")
        stack.callback(server.stop)
        server.start()
        load = Traffic(server.url, token, **traffic)
        stack.callback(load.stop)
        load.start()
        yield server, load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore.testing.traffic",
                                description="Keep a running kvstore server busy.")
    p.add_argument("--url", default=default_url(), type=url_arg,
                   help="REST base URL of the server (http:// may be left out); env "
                   "KVSTORE_URL")
    p.add_argument("--token", default=os.environ.get("KVSTORE_TOKEN"))
    p.add_argument("--pause", type=float, default=0.2, help="seconds between rounds")
    args = p.parse_args(argv)
    traffic = Traffic(args.url, args.token, pause_s=args.pause).start()
    try:
        while traffic.error is None:
            time.sleep(1)
        raise SystemExit(f"traffic failed: {traffic.error!r}")
    except KeyboardInterrupt:
        return 0
    finally:
        traffic.stop()


if __name__ == "__main__":
    raise SystemExit(main())
