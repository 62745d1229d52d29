"""Two ranks leave through ``exit_process``; each records what its exit work did.

Launched by tests/test_distributed_exit.py. Per rank, under ``--out``: ``thread-R`` (written by a
non-daemon thread still running when ``exit_process`` is called), ``late-R`` (written by an
atexit handler registered after the group was joined: runs while the group is up) and
``early-R`` (registered before: runs after the group's destruction). Rank R exits with code R.
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
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    atexit.register(record, args.out / f"early-{rank}")
    init_distributed()
    atexit.register(record, args.out / f"late-{rank}")

    def slow_write() -> None:
        time.sleep(0.5)
        (args.out / f"thread-{rank}").write_text("done")

    threading.Thread(target=slow_write).start()
    print(f"rank {rank}: unflushed", end="")  # no newline, no flush: exit_process must flush
    return rank


if __name__ == "__main__":
    exit_process(main())
