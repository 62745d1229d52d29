"""Two ranks (torchrun) run ``eviback train`` and then ``eviback eval`` in one launch: one start
of the ranks serves both two-rank checks of tests/eviback/test_eviback_train_run.py.

    python -m torch.distributed.run --nproc_per_node 2 eviback_two_ranks.py TRAIN_ARGS --then EVAL_ARGS

Each part is the `eviback` command line (``train --config ...``, ``eval --config ...``); the exit
status is the first non-zero one.
"""

from __future__ import annotations

import sys

from common.train.distributed import exit_process
from eviback.cli import main


def run(argv: list[str]) -> int:
    cut = argv.index("--then")
    return main(argv[:cut]) or main(argv[cut + 1 :])


if __name__ == "__main__":
    exit_process(run(sys.argv[1:]))
