"""A discrete-event simulator of the router's fleet: the real routing policies and cost model
(:mod:`engines.router.policies`, :mod:`engines.router.cost`) over simulated workers whose
caches, batching and speeds follow the real engine's, on the traffic of
:mod:`engines.workload`, at fleet sizes a test machine cannot run.

- :mod:`~engines.simulator.rates`: the workers' speeds (a JSON calibrated from a real run);
- :mod:`~engines.simulator.calibrate`: measures them from a real worker;
- :mod:`~engines.simulator.store`: kvstore behind the workers (shared blocks);
- :mod:`~engines.simulator.engine`: one worker (its block cache and scheduler, timed);
- :mod:`~engines.simulator.fleet`: routing and the event loop;
- :mod:`~engines.simulator.traffic`: the traffic and targets, sized as the real bench's;
- :mod:`~engines.simulator.report`, :mod:`~engines.simulator.sweep`,
  :mod:`~engines.simulator.plot`: metrics, runs over sizes and loads, the TTFT plot;
- :mod:`~engines.simulator.cli`: ``kvstore-router simulate``.
"""
