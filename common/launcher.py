"""How a package command starts and ends as a rank of the DeepSpeed launcher.

``deepspeed --num_gpus N --module eviback train ...`` starts each rank as
``python -m eviback --local_rank=I train ...`` (and sets ``LOCAL_RANK``). The project's commands
read the rank from the environment, so they drop the argument before parsing their own
(``without_local_rank``), and end through ``exit_process`` (``run_command``).
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
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
ERROR_EXIT_CODE = 2  # a setting, an input or the disk: `error: ...` in one line

_ELSEWHERE = "or point run_dir (or the command's output folder) at another"
_SPACE = f"free space there, {_ELSEWHERE} disk; a training run resumes from its latest checkpoint"
_ACCESS = f"give this user access (chmod, chown), {_ELSEWHERE} folder"
# errno -> (what it means, what to do) for the failures of a write a user can fix
_WRITE_FAILURES = {
    errno.ENOSPC: ("no space left on its disk", _SPACE),
    errno.EDQUOT: ("disk quota exceeded", _SPACE),
    errno.EFBIG: ("file too large for its file system or `ulimit -f`", f"{_ELSEWHERE} disk"),
    errno.EROFS: ("the file system is read-only", f"remount it writable, {_ELSEWHERE} folder"),
    errno.EACCES: ("permission denied", _ACCESS),
    errno.EPERM: ("operation not permitted", _ACCESS),
    errno.ENOTDIR: (
        "a part of its path is a file, not a folder",
        f"remove or rename that file, {_ELSEWHERE} folder",
    ),
}


def write_failure(err: OSError) -> str | None:
    """One line for an ``OSError`` a user fixes on the disk (full, read-only, not permitted, a
    file where a folder should be): the path (the error's, else the file being written in the
    traceback), what happened and what to do; None for any other error. An error that already
    wrote its own line (a message, no strerror: ``CheckpointSaveError``) is that line."""
    if err.errno not in _WRITE_FAILURES:
        return None
    if err.strerror is None and len(err.args) == 1:
        return str(err)
    meaning, advice = _WRITE_FAILURES[err.errno]
    path = _path_of(err)
    if err.errno in (errno.ENOSPC, errno.EDQUOT) and path is not None:
        free = _free_gib(Path(path))
        meaning += f" ({free:.2f} GiB free there)" if free is not None else ""
    return f"cannot write {path or 'a file'}: {meaning}; {advice}"


def _path_of(err: OSError) -> str | None:
    """The error's file name, else the innermost file object open in its traceback (a write's
    OSError names no file)."""
    if isinstance(err.filename, str | bytes):
        return os.fsdecode(err.filename)
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            name = getattr(value, "name", None) if isinstance(value, io.IOBase) else None
            if isinstance(name, str | bytes):
                return os.fsdecode(name)
    return None


def _space_error(err: ValueError) -> str | None:
    """The line of ``common.train.checkpoint.CheckpointSpaceError`` (the run's checkpoints
    cannot fit on its disk: found before anything is written), else None."""
    checkpoint = sys.modules.get("common.train.checkpoint")  # loaded by whatever raised it
    space_error = getattr(checkpoint, "CheckpointSpaceError", None)
    return str(err) if space_error is not None and isinstance(err, space_error) else None


def _free_gib(path: Path) -> float | None:
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free / 2**30
        except OSError:
            continue
    return None


def close_progress_bars() -> None:
    """End the progress bars a stop interrupted (their last state and a newline), so the stop's
    line is a line of its own on stderr, not the tail of a bar's."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def run_command(main: Callable[[], int]) -> NoReturn:
    """A package's console script and ``python -m``: ``main()``, then ``exit_process`` with its
    code (a launcher's rank leaves without C++'s static teardown, common.train.distributed).
    A ``RunStopped`` is printed in one line (by rank 0) and exits with ``STOPPED_EXIT_CODE``; a
    write the disk refused (``write_failure``: full, read-only, not permitted) and checkpoints
    that cannot fit on the disk, in one line naming the path and what to do, with
    ``ERROR_EXIT_CODE``."""
    try:
        code = main()
    except RunStopped as e:
        if os.environ.get("RANK", "0") == "0":
            close_progress_bars()
            print(f"stopped: {e}", file=sys.stderr, flush=True)
        code = STOPPED_EXIT_CODE
    except (OSError, ValueError) as e:
        line = write_failure(e) if isinstance(e, OSError) else _space_error(e)
        if line is None:
            raise
        world = os.environ.get("WORLD_SIZE", "1")
        rank = f"rank {os.environ.get('RANK', '0')}: " if world not in ("", "1") else ""
        close_progress_bars()
        print(f"{rank}error: {line}", file=sys.stderr, flush=True)
        code = ERROR_EXIT_CODE
    if "torch" not in sys.modules:  # --help, a config error: no process group to leave
        sys.exit(code)
    from common.train.distributed import exit_process

    exit_process(code)
