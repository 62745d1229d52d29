"""A run folder that tells the truth: one run at a time, each step logged once, the settings
that ran.

``open_run_folder`` is what every trainer calls before any model loads (rank 0 does the work;
other ranks only learn where to resume from):

    run.lock              fcntl lock held while a run owns the folder; holds pid, host, start time
    config.yaml           the settings the run started with (credentials in URLs masked)
    config_changes.jsonl  one row per accepted change: {time, from_step, changes, config}
    env.json              the environment of the first start
    env_history.jsonl     one row per start: {time, from_step, **environment}
    run.json              the method's trainer: {method, config_class, version, commit}
    data_files.json       the sha256 of each data file the config names (``data_files``) at
                          the first start, and the changes a resume was allowed to go on with
                          (written by ``common.run.Run``; what ``experiments.evaluate_all`` reads)
    metrics.jsonl         trimmed on every start to the rows of the steps it resumes after
    batches.jsonl         (``common.batches.BatchLog``) trimmed with metrics.jsonl, both read
                          and checked before either is rewritten

A start whose settings differ from the folder's (config.yaml, or the last accepted change) stops
with one line per differing key, unless the config says ``allow_config_change: true``; then the
change is recorded in config_changes.jsonl and config.yaml keeps the settings that ran first.
A resume whose data file (``assets.train``, ``assets.dev``, ``assets.corpus``) no longer has the
sha256 recorded in data_files.json stops the same way, naming the file, unless the config says
``allow_config_change: true``; then the change is recorded in data_files.json.

A trainer opens the folder with ``begin=False`` before any model loads (the lock and the settings
check) and calls ``folder.begin()`` right before its first step (or step-0 evaluation), once the
model, checkpoint and engine have loaded and passed their checks: only then are the settings,
the environment row and the trimmed log written. A start that fails on the way leaves only the
lock file, so the corrected start is not refused for the settings of one that never trained.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.config import ConfigError, config_to_dict
from common.jsonl import read_jsonl_lines, trim_jsonl, write_atomic
from common.redact import redact_secrets
from common.train.checkpoint import find_latest_checkpoint
from common.train.distributed import current_rank
from common.train.logging import environment, read_jsonl

LOCK_FILE = "run.lock"
CONFIG_FILE = "config.yaml"
CHANGES_FILE = "config_changes.jsonl"
ENV_FILE = "env.json"
ENV_HISTORY_FILE = "env_history.jsonl"
RUN_FILE = "run.json"
DATA_FILE = "data_files.json"
# the assets.* keys that name the data a run draws from (a QA file, a name -> QA file map, an
# in-process corpus); each trainer's config names them so (common/run_config.py's AssetsConfig,
# each method's assets section; GRPO's defaults under assets.world through ``cfg.path``)
DATA_ASSETS = ("train", "dev", "corpus")
METRICS_FILE = "metrics.jsonl"
BATCHES_FILE = "batches.jsonl"
# Append-only step logs a start trims to its resume point: one row a step, keyed "step".
STEP_LOGS = (METRICS_FILE, BATCHES_FILE)
# Per-step files a run rewrites as it goes: those after the resume point are removed on start.
PER_STEP_FOLDERS = ("samples", "dev_results", "test_results")
# Keys that say where or how to start, not what is trained: never a config change.
NOT_SETTINGS = frozenset({"run_dir", "resume", "allow_config_change"})
_STEP_FILE = re.compile(r"step_(\d+)\.[a-z]+")


class RunFolderError(ConfigError):
    """The run folder cannot be used as asked: held by another run, or other settings."""


class RunLock:
    """An exclusive ``fcntl.flock`` on ``<run_dir>/run.lock``, released when the process ends
    (however it ends: the kernel drops the lock with the file descriptor).

    Within one process a second ``acquire`` of a folder it already holds succeeds (an in-process
    rerun after an exception); another process gets a ``RunFolderError`` naming the holder.
    """

    _held: dict[Path, RunLock] = {}

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: str | Path) -> RunLock:
        path = (Path(run_dir) / LOCK_FILE).resolve()
        held = cls._held.get(path)
        if held is not None and held._fd is not None:
            held._write_holder()
            return held
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunFolderError(
                f"run_dir {Path(run_dir)} is in use by {holder} (lock {path}); "
                "wait for that run to end or choose another run_dir"
            ) from None
        lock = cls(path, fd)
        lock._write_holder()
        cls._held[path] = lock
        return lock

    def _write_holder(self) -> None:
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, (json.dumps(holder) + "\n").encode(), 0)

    def release(self) -> None:
        """Drop the lock (the lock file stays; only the lock itself says the folder is busy)."""
        if self._fd is None:
            return
        os.close(self._fd)  # closing the only descriptor releases the flock
        self._fd = None
        self._held.pop(self.path, None)


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']} since {info['started']}"
    except (ValueError, KeyError, TypeError):
        return "another process (its lock file names none)"


@dataclass
class RunFolder:
    """An opened run folder: where to resume from (every rank), the lock (rank 0)."""

    path: Path
    checkpoint: Path | None  # the checkpoint to resume from, None: start at step 0
    start_step: int  # the first step this start runs (0: the step-0 evaluation)
    lock: RunLock | None
    config: dict | None = None  # the settings to record (None: no settings check)
    allow_config_change: bool = False
    begun: bool = False
    method: dict | None = None  # run.json's record (None: none written, e.g. a warmup)
    data: dict | None = None  # the data files' sha256 now (``data_files``; None: not checked)
    data_changes: list | None = None  # the data files a resume goes on with changed

    def begin(self) -> None:
        """Record this start: config.yaml on the first start (or the accepted change in
        config_changes.jsonl), a row of env_history.jsonl, run.json (with ``method``),
        metrics.jsonl trimmed to the resume point. Call it once the start has passed every check that can fail before its first
        step; a second call does nothing. Rank 0 only (other ranks: nothing to do)."""
        if self.begun or self.lock is None:
            self.begun = True
            return
        logs = read_step_logs(self.path)  # a bad log stops the start before anything is written
        if self.config is not None:
            check_settings(self.path, self.config, self.start_step, self.allow_config_change)
        if self.data is not None:
            record_data_files(self.path, self.data, self.data_changes or [], self.start_step)
        env = write_environment(self.path, self.start_step)
        if self.method is not None:
            record = {**self.method, "commit": env["git"]["commit"]}
            _write_atomic(self.path / RUN_FILE, json.dumps(record, indent=1) + "\n")
        trim_run(self.path, self.start_step - 1, logs)
        self.begun = True

    def close(self) -> None:
        """Release the lock at the end of the run."""
        if self.lock is not None:
            self.lock.release()


def open_run_folder(
    run_dir: str | Path,
    cfg: Any,
    resume: bool = True,
    allow_config_change: bool | None = None,
    begin: bool = True,
    method: str | None = None,
) -> RunFolder:
    """Take ``run_dir`` for a run with config ``cfg`` (a config dataclass; None: no settings
    check, for a folder every start rewrites whole), before any model loads.

    resume: continue after the folder's latest complete checkpoint when there is one; otherwise
    the run starts at step 0 and replaces what an earlier run logged. allow_config_change:
    default ``cfg.allow_config_change``. Rank 0 locks the folder, checks and records the
    settings and environment and trims metrics.jsonl; every rank gets the resume point.
    Raises ``RunFolderError`` (a ``ConfigError``) when another run holds the folder or the
    settings differ without ``allow_config_change``. begin=False: check only (the lock, the
    settings against the folder's); nothing is written until ``folder.begin()``, which the
    trainers call right before their first step. method: the trainer's name ("grpo",
    "eviback", "cer", "arco"), recorded with ``cfg``'s class in run.json at ``begin()``.
    """
    path = Path(run_dir)
    checkpoint = find_latest_checkpoint(path) if resume else None
    last_step = checkpoint_step(checkpoint) if checkpoint is not None else -1
    folder = RunFolder(path, checkpoint, last_step + 1, None)
    if current_rank() != 0:
        return folder
    if allow_config_change is None:
        allow_config_change = bool(getattr(cfg, "allow_config_change", False))
    folder.lock = RunLock.acquire(path)
    folder.allow_config_change = allow_config_change
    if method is not None:
        folder.method = run_record(method, cfg)
    try:
        if cfg is not None:
            folder.config = redact_secrets(config_to_dict(cfg))
            check_settings(
                path, folder.config, folder.start_step, allow_config_change, dry_run=True
            )
            folder.data = data_files(cfg)
            if checkpoint is not None:  # a resume: the data the run drew from, unchanged
                folder.data_changes = check_data_files(path, folder.data, allow_config_change)
        if begin:
            folder.begin()
        else:  # a bad metrics.jsonl or batches.jsonl is found before any model loads
            with warnings.catch_warnings():  # a torn last line: begin() says so
                warnings.simplefilter("ignore")
                read_step_logs(path)
    except BaseException:
        folder.close()
        raise
    return folder


def data_files(cfg: Any) -> dict[str, dict]:
    """``assets.<key>`` (``DATA_ASSETS``; a map's entries as ``assets.<key>.<name>``) -> its
    path, size and sha256, for each that names a file (a folder, a hub id or an unset key is
    left out; the corpus too when ``assets.retrieval_url`` replaces it)."""
    import hashlib

    assets = getattr(cfg, "assets", None)
    if assets is None:
        return {}
    out = {}
    for key in DATA_ASSETS:
        if key == "corpus" and getattr(assets, "retrieval_url", ""):
            continue
        value = getattr(assets, key, None)
        if not value and callable(getattr(cfg, "path", None)):  # GRPO: the tiny world's file
            try:
                value = cfg.path(key)
            except (KeyError, ValueError, AttributeError):
                value = None
        named = value.items() if isinstance(value, dict) else [("", value)]
        for name, where in named:
            if not isinstance(where, str) or not where or not Path(where).is_file():
                continue
            digest = hashlib.sha256()
            with open(where, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            out[f"assets.{key}" + (f".{name}" if name else "")] = {
                "path": where,
                "bytes": Path(where).stat().st_size,
                "sha256": digest.hexdigest(),
            }
    return out


def check_data_files(run_dir: Path, now: dict[str, dict], allow_change: bool) -> list[dict]:
    """A resume's data files against data_files.json's sha256: a ``RunFolderError`` naming
    each changed file, unless ``allow_change``; the changes (none: a folder without the record,
    written before it, has nothing to compare)."""
    saved_file = run_dir / DATA_FILE
    if not saved_file.exists():
        return []
    try:
        saved = json.loads(saved_file.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunFolderError(f"{saved_file}: unreadable ({err!r})") from None
    changes = [
        {"key": key, "path": now[key]["path"], "saved": was["sha256"], "new": now[key]["sha256"]}
        for key, was in saved.items()
        if key in now and isinstance(was, dict) and was.get("sha256") != now[key]["sha256"]
    ]
    if not changes:
        return []
    what = "; ".join(
        f"{c['key']} {c['path']} (sha256 {c['saved'][:12]} -> {c['new'][:12]})" for c in changes
    )
    if not allow_change:
        raise RunFolderError(
            f"run_dir {run_dir}: a data file changed since the run started ({DATA_FILE}): "
            f"{what}; a resume would draw other questions than the run did: restore the file, "
            "set allow_config_change=true to go on with it (recorded in "
            f"{DATA_FILE}), or choose another run_dir"
        )
    print(f"[run] {run_dir}: going on with a changed data file ({what})", flush=True)
    return changes


def record_data_files(run_dir: Path, now: dict[str, dict], changes: list, start_step: int) -> None:
    """data_files.json: this start's data files (the first start's, a fresh start's, or a
    resume's with the changes it was allowed to go on with appended)."""
    path = run_dir / DATA_FILE
    history = []
    if start_step > 0 and path.exists():
        try:
            history = list(json.loads(path.read_text(encoding="utf-8")).get("changes", []))
        except (OSError, ValueError, AttributeError):
            history = []
    history += [{"time": _now(), "from_step": start_step, **c} for c in changes]
    _write_atomic(path, json.dumps({"files": now, "changes": history}, indent=1) + "\n")


def run_record(method: str, cfg: Any) -> dict:
    """run.json's fields but the commit: the method, its config class, the package version."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = version("rlrewards")
    except PackageNotFoundError:
        package = None
    kind = type(cfg)
    return {
        "method": method,
        "config_class": f"{kind.__module__}.{kind.__qualname__}",
        "version": package,
    }


def checkpoint_step(checkpoint: Path) -> int:
    """The step a complete checkpoint folder was saved at (its trainer_state.json)."""
    state = checkpoint / "trainer_state.json"
    try:
        return int(json.loads(state.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RunFolderError(f"{state}: unreadable trainer state: {err!r}") from None


def check_settings(
    run_dir: Path, config: dict, start_step: int, allow_change: bool, dry_run: bool = False
) -> None:
    """Compare ``config`` with the folder's settings; write config.yaml on the first start,
    refuse a difference or (``allow_change``) record it in config_changes.jsonl.
    dry_run: refuse a difference, write nothing."""
    saved_file = run_dir / CONFIG_FILE
    if not saved_file.exists():
        if not dry_run:
            _write_atomic(saved_file, yaml.safe_dump(config, sort_keys=False))
        return
    try:
        saved = yaml.safe_load(saved_file.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise RunFolderError(f"{saved_file}: not valid YAML: {err}") from None
    changes_file = run_dir / CHANGES_FILE
    if changes_file.exists():
        accepted = read_jsonl(changes_file, key="config")
        if accepted:
            saved = accepted[-1]["config"]
    changes = config_diff(saved if isinstance(saved, dict) else {}, config)
    if not changes:
        return
    lines = "\n".join(f"  {key}: {_show(old)} -> {_show(new)}" for key, old, new in changes)
    # a setting the folder's config lacks was added by a newer version of the code: the run
    # goes on under it (recorded below) without allow_config_change
    added_only = all(old is _ABSENT for _, old, _ in changes)
    if not allow_change and not added_only:
        raise RunFolderError(
            f"run_dir {run_dir} holds a run with other settings ({saved_file}"
            f"{' and ' + CHANGES_FILE if changes_file.exists() else ''}); saved -> new:\n{lines}\n"
            "set allow_config_change=true to continue with the new settings (the change is "
            f"recorded in {CHANGES_FILE}), or choose another run_dir"
        )
    if dry_run:
        return
    record = {
        "time": _now(),
        "from_step": start_step,
        "changes": [
            {"key": k, "saved": _jsonable(old), "new": _jsonable(new)} for k, old, new in changes
        ],
        "config": config,
    }
    with changes_file.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    what = "settings this version added" if added_only else "settings changed"
    print(
        f"[run] {run_dir}: {what} from step {start_step} on (recorded in {changes_file}):\n{lines}",
        flush=True,
    )


def config_diff(saved: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """``(dotted key, saved, new)`` for every setting that differs (keys in ``NOT_SETTINGS``
    aside; a key only one side has is a difference, shown as ``<absent>``)."""
    a, b = _flatten(saved), _flatten(new)
    out = []
    for key in [*a, *(k for k in b if k not in a)]:
        if key in NOT_SETTINGS:
            continue
        old, value = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if not _same(old, value):
            out.append((key, old, value))
    return out


class _Absent:
    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


def _jsonable(value: Any) -> Any:
    """A setting's value as config_changes.jsonl writes it: ``"<absent>"`` for a missing key."""
    return repr(value) if value is _ABSENT else value


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as YAML reads them back: tuples are lists, NaN equals NaN, 1 equals 1.0."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return type(a) is type(b) and a == b or (_number(a) and _number(b) and a == b)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, _Absent) else json.dumps(value)


def write_environment(run_dir: Path, start_step: int) -> dict:
    """env.json on the first start (kept after); every start appends a row to env_history.jsonl.
    Returns this start's environment."""
    env = environment()
    if not (run_dir / ENV_FILE).exists():
        _write_atomic(run_dir / ENV_FILE, json.dumps(env, indent=1))
    with (run_dir / ENV_HISTORY_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"time": _now(), "from_step": start_step, **env}) + "\n")
    return env


def read_step_logs(run_dir: Path) -> dict[Path, list[tuple[dict, str]]]:
    """The rows of the folder's step logs (``STEP_LOGS`` that exist), each with its line:
    every log read and checked (``common.jsonl.read_jsonl_lines``: a torn last line dropped
    with a warning, any other bad line a ``ValueError`` naming file:line) before any is
    rewritten, so a bad ``batches.jsonl`` leaves ``metrics.jsonl`` as it was."""
    logs = {}
    for name in STEP_LOGS:
        path = run_dir / name
        if path.exists():
            logs[path] = read_jsonl_lines(path, key="step", stacklevel=3)
    return logs


def trim_run(
    run_dir: Path, last_step: int, logs: dict[Path, list[tuple[dict, str]]] | None = None
) -> None:
    """Keep what the run logged up to ``last_step`` (the checkpoint it resumes from; -1: none):
    rows of metrics.jsonl and batches.jsonl with a larger step are dropped (atomically, each
    kept line as written), as are per-step files (samples/, dev_results/) of later steps. A torn
    last line of either log is dropped. ``logs``: ``read_step_logs(run_dir)`` when already read."""
    if logs is None:
        logs = read_step_logs(run_dir)
    for path, rows in logs.items():
        dropped = trim_jsonl(path, rows, lambda r: r["step"] <= last_step)
        if dropped:
            after = "a checkpoint" if last_step < 0 else f"step {last_step}"
            print(
                f"[run] {path}: dropped {dropped} rows logged after {after} "
                "(this start runs those steps again)",
                flush=True,
            )
    for name in PER_STEP_FOLDERS:
        folder = run_dir / name
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            m = _STEP_FILE.fullmatch(f.name)
            if m and int(m.group(1)) > last_step and f.is_file():
                f.unlink()


def _write_atomic(path: Path, text: str) -> None:
    """``text`` into a temporary file beside ``path``, then renamed over it."""
    write_atomic(path, text)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


__all__ = [
    "RunFolder",
    "RunFolderError",
    "RUN_FILE",
    "RunLock",
    "check_settings",
    "config_diff",
    "open_run_folder",
    "read_step_logs",
    "trim_run",
]
