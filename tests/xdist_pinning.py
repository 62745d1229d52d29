"""Each pytest-xdist worker on its own share of the CPUs (``make test``'s workers).

Unpinned, two workers' torch threads and vLLM's core-bound OpenMP threads share both cores of a
2-core machine, and the suite took longer on two workers than in one process (benchmarks/README.md
"The test suite"). Pinned, each worker (and every rank and command a test starts, which inherit
its affinity and ``OMP_NUM_THREADS``) runs on its own cores.
"""

from __future__ import annotations

import os


def worker_cpus(worker: str, count: int, cpus: list[int]) -> list[int]:
    """The CPUs pytest-xdist worker ``gwN`` of ``count`` runs on: every ``count``-th of ``cpus``
    from the N-th, so no two workers share one; all of ``cpus`` when there are fewer CPUs than
    workers or ``worker`` is not one (the suite in one process)."""
    if not worker.startswith("gw") or count < 2 or count > len(cpus):
        return list(cpus)
    return list(cpus)[int(worker[2:]) :: count]


def pin_xdist_worker() -> list[int]:
    """Pin this process when it is an xdist worker (``PYTEST_XDIST_WORKER``), with as many OpenMP
    threads as CPUs; call it before torch is imported (it reads ``OMP_NUM_THREADS`` once).
    Returns the CPUs it runs on."""
    if not hasattr(os, "sched_setaffinity"):
        return []
    allowed = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    share = worker_cpus(os.environ.get("PYTEST_XDIST_WORKER", ""), count, allowed)
    if share != allowed:
        os.sched_setaffinity(0, share)
        os.environ["OMP_NUM_THREADS"] = str(len(share))
    return share
