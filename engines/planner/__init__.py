"""The SLO planner (``kvstore-planner``): watches each pool's latency against its targets and
moves workers between the prefill and decode roles, or recommends scaling (see
:mod:`engines.planner.loop`)."""
