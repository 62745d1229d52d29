"""Ranks leave through ``exit_process``; each records what its exit work did.

Launched by tests/test_distributed_exit.py. Per rank R, under ``--out``: ``thread-R`` (written
by a non-daemon thread still running when ``exit_process`` is called), ``late-R`` (written by an
atexit handler registered after the group was joined: runs while the group is up), ``early-R``
(registered before: runs after the group's destruction) and ``shm-R`` (the DeepSpeed shm
allreduce segments the rank has mapped, as /proc/self/maps names them). Each rank exits with
``--code``.
"""

from __future__ import annotations

import argparse
import atexit
import os
import threading
import time
from pathlib import Path

import torch.distributed as dist

from common.train.distributed import exit_process, init_distributed


def record(path: Path) -> None:
    path.write_text(f"group up: {dist.is_initialized()}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    atexit.register(record, args.out / f"early-{rank}")
    init_distributed()
    atexit.register(record, args.out / f"late-{rank}")
    maps = Path("/proc/self/maps").read_text().splitlines()
    shm = sorted({line.split(None, 5)[-1] for line in maps if "deepspeed_allreduce_buffer" in line})
    (args.out / f"shm-{rank}").write_text("\n".join(shm))

    def slow_write() -> None:
        time.sleep(0.5)
        (args.out / f"thread-{rank}").write_text("done")

    threading.Thread(target=slow_write).start()
    print(f"rank {rank}: unflushed", end="")  # no newline, no flush: exit_process must flush
    return args.code


if __name__ == "__main__":
    exit_process(main())
