"""One rank of a 2-process gloo job on 127.0.0.1 for ``test_dist_agreement.py``: ``python dist_worker.py SCENARIO
ATTNKIT-ARGS...`` with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set. The scenario makes this rank
differ as a real machine could, then the command line runs (its exit status is this process's).

- ``plain``: nothing changed;
- ``own-decisions``: this rank's measurements would choose bf16 and another step count on rank 1 (a slower
  or differently equipped machine), fp32 on rank 0;
- ``stops``: rank 1 stops answering (sleeps) in step 3, as a rank stopped by a debugger or a dead NFS mount;
- ``signal``: rank 1 gets SIGTERM in step 3 (a scheduler's stop that reached one rank first).
"""

import os
import signal
import sys
import time

from attnkit.cli.main import main
from attnkit.training import loop, start

RANK = int(os.environ["RANK"])


def own_decisions():
    def choose(step_fn, device, **kwargs):
        step_fn("fp32")  # the same calls on every rank, as the real measurement makes
        choice = "bf16" if RANK == 1 else "fp32"
        return choice, {"summary": f"rank {RANK} measured", "median_s": {choice: 0.01 * (1 + 3 * RANK)}}

    start.choose_precision = choose


def stops():
    real = loop.optimizer_step

    def step(setup, progress, **kwargs):
        if RANK == 1 and progress.step + 1 == 3:
            time.sleep(3600)
        return real(setup, progress, **kwargs)

    loop.optimizer_step = step


def signal_rank_1():
    real = loop.optimizer_step

    def step(setup, progress, **kwargs):
        if RANK == 1 and progress.step + 1 == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the request: the step finishes
        return real(setup, progress, **kwargs)

    loop.optimizer_step = step


if __name__ == "__main__":
    scenario, args = sys.argv[1], sys.argv[2:]
    {"plain": lambda: None, "own-decisions": own_decisions, "stops": stops, "signal": signal_rank_1}[scenario]()
    sys.exit(main(args))
