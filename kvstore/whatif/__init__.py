"""What-if sizing: live miss-ratio curves of a tier, per namespace or tenant, from a sample of
block hashes: LRU from reuse distances (SHARDS, Waldspurger et al., FAST'15), other policies by
miniature simulations (Waldspurger et al., USENIX ATC'17).

:class:`WhatIfTracker` is the entry point (one per tier); :mod:`.config` holds the defaults;
:mod:`.sampler`, :mod:`.stack`, :mod:`.histogram`, :mod:`.tracked` and :mod:`.minisim` are its
parts; :mod:`.simcache` is the simulated cache that the miniature simulations, the tests and
the accuracy bench (``bench/bench_whatif.py``) replay through the real policy classes.
"""

from __future__ import annotations

from kvstore.whatif.config import WhatIfConfig
from kvstore.whatif.result import Curve, Method, Point, interpolate
from kvstore.whatif.simcache import SimCache, replay
from kvstore.whatif.tracker import WhatIfTracker

__all__ = ["Curve", "Method", "Point", "SimCache", "WhatIfConfig", "WhatIfTracker",
           "interpolate", "replay"]
