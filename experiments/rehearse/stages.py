"""A rehearsal's stages: each a command a user runs (``python -m eviback train --config ...``),
run as a subprocess with its output in a log file, timed, its peak memory read from the kernel's
accounting of the process tree (``wait4``), and its outcome checked from what it wrote."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Check = Callable[[], dict[str, Any]]


@dataclass
class Stage:
    """One command of the pipeline. ``module`` runs as ``python -m module *args``; with ``ranks``
    above 1 under the DeepSpeed launcher (``--module``), as a user scales it out. ``check`` reads
    what the stage wrote and returns its counts (e.g. teacher calls); it raises ``StageFailed``
    when the stage exited 0 but did not do what it must. ``make``: the make target the stage
    stands for (the README's name); with ``make_vars`` it runs as ``make TARGET VARS ARGS=...``
    (the overrides after ``--config``), else as the command that target runs."""

    name: str
    module: str
    args: list[str]
    ranks: int = 1
    check: Check | None = None
    timeout_s: float = 1800.0
    env: dict[str, str] = field(default_factory=dict)
    before: Callable[[], None] | None = None  # e.g. the endpoint's counts before the stage
    make: str | None = None
    make_vars: dict[str, str] | None = None
    readme: bool = True  # a step of the README's "One paper run" (False: the rehearsal's own)


class StageFailed(RuntimeError):
    """A stage that ran but whose outputs show that a path it must exercise did not run."""


@dataclass
class StageResult:
    name: str
    ok: bool
    seconds: float
    peak_rss_mib: float
    log: str
    returncode: int | None = None
    error: str = ""
    counts: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    make: str = ""  # the make target it stands for ("" for the rehearsal's own)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def command_line(stage: Stage, port: int | None = None) -> list[str]:
    """The argv a user would type for ``stage``: its make target, or the command (the
    launcher's when ``ranks`` > 1)."""
    if stage.make and stage.make_vars is not None:
        from experiments.rehearse.walk import make_argv

        return make_argv(
            stage.make, stage.make_vars, config_overrides(stage.args), stage.ranks, port
        )
    if stage.ranks <= 1:
        return [sys.executable, "-m", stage.module, *stage.args]
    launcher = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(stage.ranks)]
    if port is not None:
        launcher += ["--master_port", str(port)]
    return [*launcher, "--module", stage.module, *stage.args]


def config_overrides(args: Sequence[str]) -> list[str]:
    """The ``key=value`` overrides of a trainer's arguments (``SUB --config F [--variant V]
    key=value ...``): what follows the options."""
    rest, i = list(args), 1 if args and not args[0].startswith("-") else 0
    while i < len(rest) and rest[i].startswith("--"):
        i += 2
    return rest[i:]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_stage(stage: Stage, log: Path, cwd: Path, env: dict[str, str]) -> StageResult:
    """Run ``stage`` to completion (or its timeout: the process group is killed) and check it."""
    argv = command_line(stage, free_port() if stage.ranks > 1 else None)
    log.parent.mkdir(parents=True, exist_ok=True)
    prog = "python " if argv[0] == sys.executable else ""
    shown = " ".join(argv[1:]) if prog else shlex.join(argv)
    t0 = time.perf_counter()
    with log.open("w") as out:
        out.write(f"$ {prog}{shown}\n")
        out.flush()
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env | stage.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills the whole tree
        )
        status, rusage, timed_out = _wait(proc, stage.timeout_s)
    seconds = time.perf_counter() - t0
    peak = rusage.ru_maxrss / 1024 if rusage is not None else 0.0  # KiB on Linux
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    result = StageResult(
        stage.name, False, seconds, peak, str(log), returncode=code, command=f"{prog}{shown}"
    )
    result.make = (stage.make or "") if stage.readme else ""
    if timed_out:
        result.error = f"timed out after {stage.timeout_s:.0f} s"
    elif code != 0:
        result.error = f"exit status {code}: {last_error_line(log)}"
    else:
        try:
            result.counts = stage.check() if stage.check else {}
            result.ok = True
        except StageFailed as e:
            result.error = str(e)
        except Exception as e:  # a check that cannot read the outputs is the stage's failure
            result.error = f"its outputs could not be read: {type(e).__name__}: {e}"
    return result


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, Any, bool]:
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, rusage, False
        if time.monotonic() > deadline:
            with _ignore_missing():
                os.killpg(proc.pid, signal.SIGKILL)
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, rusage, True
        time.sleep(0.2)


class _ignore_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, tp, value, tb) -> bool:
        return tp is ProcessLookupError


MAKE_FAILED = re.compile(r"^make(\[\d+\])?: \*\*\* ")  # make's own line after a recipe fails


def last_error_line(log: Path, lines: int = 400) -> str:
    """The most telling line of a failed command's log: its last ``error:`` line or exception
    (a command run through make: its own, not make's ``make: *** [...] Error N``)."""
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    for line in reversed(tail):
        text = line.strip()
        if (
            text
            and not MAKE_FAILED.match(text)
            and (
                "error" in text.lower() or text.startswith(("Traceback", "raise", "AssertionError"))
            )
        ):
            return text[:400]
    return next((t.strip()[:400] for t in reversed(tail) if t.strip()), "(no output)")


def overrides(values: dict[str, Any]) -> list[str]:
    """``key=value`` arguments, values as YAML reads them back (lists/dicts in flow style)."""
    import yaml

    out = []
    for key, value in values.items():
        if isinstance(value, str):
            text = value
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
            text = text.removesuffix("\n...").strip()
        out.append(f"{key}={text}")
    return out


def read_jsonl(path: Path) -> list[dict]:
    """A log the run appended to (``common.jsonl.read_jsonl``: a torn last line dropped)."""
    from common.jsonl import read_jsonl as read_log

    return read_log(path)


def metric_sum(rows: Sequence[dict], key: str) -> float:
    return float(sum(r.get(key, 0.0) or 0.0 for r in rows))
