"""The bench launcher's placement of a child process: its CPU priority and its cores are set
as it starts (a routing bench keeps its workers below the router and clients, and a pool's
workers on cores of their own)."""

from __future__ import annotations

import os
import sys

import pytest

from engines.testing import Proc
from kvstore.testing.proc import free_port


def test_nice_and_cores_apply_to_the_child() -> None:
    core = min(os.sched_getaffinity(0))
    proc = Proc([sys.executable, "-c", "import time; time.sleep(60)"], free_port(),
                nice=7, cpus={core})
    proc.start(wait=False)
    try:
        assert proc.proc is not None
        pid = proc.proc.pid
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 7
        assert os.sched_getaffinity(pid) == {core}
    finally:
        proc.kill()


def test_a_negative_nice_is_refused() -> None:
    with pytest.raises(ValueError, match="nice"):
        Proc([sys.executable, "-c", "pass"], free_port(), nice=-1)
