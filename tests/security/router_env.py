"""A real ``kvstore-router`` (with a tokenizer) in front of a real ``kvstore-engine serve``
worker on loopback, over a tiny random Llama, for the router's security tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from engines.testing import Proc, engine_proc, router_proc
from tests.engines.conftest import make_checkpoint, make_tokenizer


class RouterEnv(NamedTuple):
    router: Proc
    worker: Proc

    def worker_stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(f"{self.worker.url}/stats", timeout=30).json()
        return doc


@contextmanager
def router_env(tmp: Path, *, router_args: tuple[str, ...] = (), context: int = 512,
               worker_args: tuple[str, ...] = ("--block-size", "4", "--num-blocks", "128")
               ) -> Iterator[RouterEnv]:
    """Start a worker over a model of ``context`` positions and a router before it; yield
    both once the router is ready; stop both."""
    model = make_checkpoint(tmp / "model", max_position_embeddings=context)
    tokenizer = make_tokenizer(tmp / "tokenizer")
    worker = engine_proc(model, args=worker_args)
    router = router_proc([worker.url], args=("--tokenizer", str(tokenizer), *router_args))
    worker.start(wait=False)
    router.start(wait=False)
    try:
        worker.wait_ready()
        router.wait_ready()
        deadline = time.monotonic() + 60
        while not httpx.get(f"{router.url}/health", timeout=10).json()["ready"]:
            assert time.monotonic() < deadline, router.log()
            time.sleep(0.1)
        yield RouterEnv(router, worker)
    finally:
        router.stop()
        worker.stop()
