"""Each rank's torch threads once it joined the group: ``init_distributed``, then DIR/rank<R>.txt
holding ``threads T omp O``. Launched by tests/test_rank_threads.py as two CPU ranks with
``--out DIR``."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from common.train.distributed import barrier, exit_process, init_distributed

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    rank, world, _ = init_distributed()
    assert world == 2, world
    omp = os.environ.get("OMP_NUM_THREADS", "unset")
    (args.out / f"rank{rank}.txt").write_text(f"threads {torch.get_num_threads()} omp {omp}")
    barrier()
    exit_process(0)
