"""The argument the DeepSpeed launcher adds to every rank's command line.

``deepspeed --num_gpus N --module eviback train ...`` starts each rank as
``python -m eviback --local_rank=I train ...`` (and sets ``LOCAL_RANK``). The project's commands
read the rank from the environment, so they drop the argument before parsing their own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


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
