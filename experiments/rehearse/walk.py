"""The README's "One paper run", as the rehearsal walks it: the make targets a researcher types,
in their order, pointed at the stand-ins by the Makefile's own variables (``SCALE``, ``DATA``,
``VARIANT``, ``INDEX``, ``HUB``, ``PORT``, ``ENCODER``, ``WAIT_S``, ``ARGS``), and the services
the README starts with ``&`` run in the background and stopped, process group and all.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# README commands the rehearsal does not run, and why
SKIPPED = {
    "rehearse": "the rehearsal itself",
    "gpu-check": "needs a GPU (CUDA kernels, bf16 on the device, memory by phase): run it there",
    "serve-teacher": "vLLM serving the teacher needs GPUs: the stand-in endpoint answers in its "
    "place, on loopback (a share of its answers malformed, 5xx or late)",
}
_MAKE = re.compile(r"(?:^|&&|;)\s*(?:[A-Z_]+=\S*\s+)*make\s+([a-z][\w-]*)")
_METHOD = re.compile(r"\bMETHOD=(\w+)")


def readme_sequences(readme: str) -> dict[str, list[str]]:
    """The make targets of each code block of the README's "One paper run" section, in order,
    by method (the block's ``METHOD=``)."""
    section = readme.split("## One paper run", 1)[-1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", section, flags=re.S | re.M)
    out: dict[str, list[str]] = {}
    for block in blocks:
        method = _METHOD.search(block)
        if method is None:
            raise ValueError(f"a One paper run block names no METHOD=: {block[:80]!r}")
        targets = [t for line in block.splitlines() for t in _MAKE.findall(line.split("#")[0])]
        out[method[1]] = targets
    return out


def walked(sequence: Sequence[str]) -> list[str]:
    """The targets of a README sequence the rehearsal runs (``SKIPPED`` left out)."""
    return [t for t in sequence if t not in SKIPPED]


def make_vars(config: str | Path, variant: str | None = None) -> dict[str, str]:
    """``METHOD``, ``SCALE`` (and ``DATA``, ``VARIANT``) that make the Makefile pick ``config``:
    ``eviback/configs/qwen3_<S>.yaml``, ``cer/configs/qwen3_<S>_base_<D>.yaml``,
    ``arco/configs/<model>_<D>.yaml`` (SCALE the model with ``-`` for ``_``)."""
    path = Path(config)
    method, stem = path.parent.parent.name, path.stem
    if path.parent.name != "configs":
        raise ValueError(f"{config}: not a config under <method>/configs/")
    found: dict[str, str] | None = None
    if method == "eviback" and (m := re.fullmatch(r"qwen3_([\w.]+)", stem)):
        found = {"SCALE": m[1]}
    elif method == "cer" and (m := re.fullmatch(r"qwen3_([\w.]+)_base_(\w+)", stem)):
        found = {"SCALE": m[1], "DATA": m[2]}
    elif method == "arco" and (m := re.fullmatch(r"([\w.]+)_(hotpotqa|2wiki|musique)", stem)):
        found = {"SCALE": m[1].replace("_", "-"), "DATA": m[2]}
    if found is None:
        raise ValueError(f"{config}: no SCALE/DATA of the Makefile picks it")
    return {"METHOD": method, **found} | ({"VARIANT": variant} if variant else {})


MAKE_ENV = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def without_make_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` less what an outer make (``make rehearse VARIANT=...``) hands its children: its
    variables would reach the rehearsal's own make commands."""
    return {k: v for k, v in env.items() if k not in MAKE_ENV}


def shell_args(overrides: Sequence[str]) -> str:
    """``ARGS=`` for overrides: quoted for the recipe's shell, ``$`` doubled for make."""
    return shlex.join(overrides).replace("$", "$$")


def make_argv(
    target: str,
    variables: dict[str, str],
    overrides: Sequence[str] = (),
    ranks: int = 1,
    port: int | None = None,
) -> list[str]:
    """``make TARGET VAR=... ARGS=...`` with this interpreter (``PY``) and its venv (``VENV``:
    the DeepSpeed launcher under ``GPUS=``); ``ranks`` above 1: ``GPUS=ranks``."""
    py = Path(sys.executable)
    argv = ["make", "--no-print-directory", target, f"PY={py}", f"VENV={py.parent.parent}"]
    argv += [f"{k}={v}" for k, v in variables.items()]
    if ranks > 1:
        argv.append(f"GPUS={ranks}")
        if port is not None:
            argv.append(f"DS_ARGS=--master_port {port}")
    if overrides:
        argv.append(f"ARGS={shell_args(overrides)}")
    return argv


@cache
def runs_through_make(target: str, variables: tuple[tuple[str, str], ...], config: str) -> bool:
    """Whether ``make TARGET`` with ``variables`` runs ``config``'s command with ``ARGS`` (its
    dry run, ``make -n``, names both): then a stage runs through it."""
    probe = "rehearse.probe=1"
    argv = make_argv(target, dict(variables), [probe])
    try:
        run = subprocess.run(
            [argv[0], "-n", *argv[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=without_make_env(dict(os.environ)),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return run.returncode == 0 and probe in run.stdout and f"--config {config}" in run.stdout


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s process group (make, its shell, the server), SIGKILL after
    ``grace_s``; every process of the group is gone on return."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not group_alive(proc.pid):
                return
            time.sleep(0.1)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still there (its reaped leader is not)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def background(
    argv: Sequence[str], log: Path, env: dict[str, str], grace_s: float = 10.0
) -> Iterator[subprocess.Popen]:
    """``argv`` as the README's ``make ... &``: in its own process group, output to ``log``;
    stopped with the whole group when the block ends, by an error or not (SIGTERM, then
    SIGKILL after ``grace_s``)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write(f"$ {shlex.join(argv)} &\n")
        out.flush()
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop_group(proc, grace_s)
