"""Runners: where the stateless stages run.

A runner executes ``stage_index, frame -> frame`` for the parallel stages of a plan (the
`Runner` protocol, `zephon_columnar.engine.runners.base`):

- ``inline`` (`inline`): in the calling thread, nothing in the background;
- ``threads`` (`threads`): a pool of daemon threads, each with its own deep copy of the
  operators, set up once (Arrow, Polars and tokenizers release the GIL in their kernels);
- ``process`` (`process`): spawned worker processes holding cloudpickled operators; frames
  cross as Arrow IPC streams (no pickled rows);
- ``remote`` (`remote`, also ``"ray"``): Ray actors on the cluster ``ray.init`` connected to.

The lanes submit frames ahead and read results in submission order (`engine.lane.steps.ParallelStep`),
which is what makes the output independent of which worker finished first. They read them
through ``runner.result(future)``: on the runners whose calls run elsewhere (`waits`) that wait
wakes every 0.1 s, so ``close()`` from another thread releases it, and
``options(op_timeout_s=...)`` turns a call that never returns into an error naming its
operators and first sample. Worker threads are daemons and ``close()`` gives running calls a
second, then leaves a stuck one behind; it terminates worker processes when a call is still
running: a user function that never returns cannot keep the process from exiting.

What the engine reads about a runner is its `RunnerTraits`; the registry (`registry`) is the
only place a runner's name is looked up. docs/contributing.md says how to add a runner.
"""

from zephon_columnar.engine.runners.base import Runner, RunnerBase, RunnerTraits
from zephon_columnar.engine.runners.registry import DAEMON_STAND_IN, RUNNERS, runner_traits, start_runner

__all__ = ["DAEMON_STAND_IN", "RUNNERS", "Runner", "RunnerBase", "RunnerTraits", "runner_traits", "start_runner"]
