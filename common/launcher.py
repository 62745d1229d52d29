"""How a package command starts and ends as a rank of the DeepSpeed launcher.

``deepspeed --num_gpus N --module eviback train ...`` starts each rank as
``python -m eviback --local_rank=I train ...`` (and sets ``LOCAL_RANK``). The project's commands
read the rank from the environment, so they drop the argument before parsing their own
(``without_local_rank``), and end through ``exit_process`` (``run_command``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn


def without_local_rank(argv: Sequence[str] | None = None) -> list[str]:
    """``argv`` (default ``sys.argv[1:]``) without ``--local_rank=I`` / ``--local_rank I``;
    ``LOCAL_RANK`` is set from it when the environment lacks it."""
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(("--local_rank=", "--local-rank=")):
            os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        elif arg in ("--local_rank", "--local-rank") and i + 1 < len(args):
            os.environ.setdefault("LOCAL_RANK", args[i + 1])
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


class RunStopped(RuntimeError):
    """A guard stopped a run (a failing teacher or server, non-finite numbers): the message is
    the one line that says why; the checkpoints saved before it are intact. Every rank raises it
    at the same step, so no rank waits in a collective."""


STOPPED_EXIT_CODE = 3


def run_command(main: Callable[[], int]) -> NoReturn:
    """A package's console script and ``python -m``: ``main()``, then ``exit_process`` with its
    code (a launcher's rank leaves without C++'s static teardown, common.train.distributed).
    A ``RunStopped`` is printed in one line (by rank 0) and exits with ``STOPPED_EXIT_CODE``."""
    try:
        code = main()
    except RunStopped as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"stopped: {e}", file=sys.stderr, flush=True)
        code = STOPPED_EXIT_CODE
    if "torch" not in sys.modules:  # --help, a config error: no process group to leave
        sys.exit(code)
    from common.train.distributed import exit_process

    exit_process(code)
