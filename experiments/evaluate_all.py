"""Every trained run on its method's benchmarks: one table with intervals, each method against its
baseline on the same questions, the papers' numbers beside them.

    python -m experiments.evaluate_all [RUN_OR_FOLDER ...] [--out runs/eval] [--step N] [--ranks N]
                                       [--retrieval-index DIR]

Every folder under the given ones (default ``runs/``) that holds a ``config.yaml`` is a run; its
trainer is the one its ``run.json`` names (written by ``common.run.Run``; a folder without one, a
warmup or a run from before run.json, has its trainer guessed from the config's keys, and the
guesses are counted), its method and arm come from the config (``recognise``): the reference
GRPO loop and its warmup
(``common.search_grpo``, ``common.warmup``), EviBack and its Search-R1 baseline
(``teacher.enabled=false``), CER by reward type and its warmup, ARCO and its outcome-only
and PRM baselines (``method=outcome_only|prm``). The run's final checkpoint (``--step N``:
``checkpoints/step_N``; a warmup: its ``model/``) is evaluated by its package's own evaluator (``cer.evaluate``,
``eviback.evaluate``, ``arco.evaluate``; ``common.rl_loop.evaluate`` on the world's test split
for GRPO runs) in a subprocess, under ``torchrun`` with ``--ranks N`` (every evaluator shards
its questions over the ranks; rank 0 writes the rows). Each evaluation is cached in ``<out>/cache/`` under a hash of the method,
the checkpoint's files and the run's config, so a second call evaluates only what is new.

A search run (the GRPO loop, EviBack, ARCO outside the distractor setting) whose
``assets.retrieval_url`` does not answer a query is listed with that reason before any engine
starts; with ``--retrieval-index DIR`` (``make eval-all`` passes ``INDEX``, Search-R1's folder by
default) a loopback URL that does not answer gets ``common.retrieval serve --index DIR`` started
on its port, once, and stopped when eval-all ends (``RetrievalServers``).

``<out>/results.md`` and ``results.json``: one row per run and benchmark with the metrics the
paper reports and their 95% percentile-bootstrap intervals over questions; paired-bootstrap
intervals (``common.bootstrap.paired_bootstrap``) of each run against its baseline where both were
evaluated on the same questions of the same file; the papers' published numbers (each package's
``published.yaml``) in their own section; a run that could not be evaluated, with the reason.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from common.bootstrap import paired_bootstrap, ratio_interval
from common.config import path_name
from common.jsonl import write_atomic
from common.launcher import write_failure
from experiments.method_kinds import COLUMNS, KIND, PAIRED

CACHE_VERSION = 1
RUN_FILE = "run.json"  # common.train.run_folder.RUN_FILE: the trainer that wrote the run
WARMUPS = ("warmup", "cer_warmup")  # no run.json: their trainers are not run frames
SKIP_DIRS = {
    "checkpoints",
    "dev_results",
    "test_results",
    "samples",
    "model",
    "tensorboard",
    "wandb",
    "eval",
}

# metric -> (per-question field summed, per-question field it is divided by; None: a mean)
DEFINITIONS = {
    "em": ("em", None),
    "f1": ("f1", None),
    "valid_answer_rate": ("valid", None),
    "mean_searches": ("searches", None),
    "forced_termination_rate": ("forced", None),
    "duplicate_query_rate": ("duplicates", "searches"),
    "greedy": ("greedy", None),
    "avg@k": ("avg@k", None),
    "greedy_containment": ("greedy_contains", None),
    "greedy_f1": ("greedy_f1", None),
}
TITLES = {
    "search": "Reference GRPO and its warmup (common.rl_loop.evaluate, greedy)",
    "eviback": "EviBack and the Search-R1 baseline (eviback.evaluate, greedy)",
    "arco": "ARCO and its outcome-only and PRM baselines (arco.evaluate, greedy)",
    "cer": "CER by training reward (cer.evaluate: greedy and avg@k accuracy by the rule verifier)",
}
PUBLISHED_FILES = {
    "eviback": "eviback/published.yaml",
    "cer": "cer/published.yaml",
    "arco": "arco/published.yaml",
}


@dataclass
class Run:
    """One run folder: its method (``None``: not recognised), arm (method and variant), the model
    to evaluate, and why it cannot be evaluated (``problem``)."""

    path: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    method: str | None = None
    arm: str | None = None
    model: Path | None = None
    problem: str | None = None
    notes: list[str] = field(default_factory=list)  # e.g. an unreadable cache record, redone
    guessed: bool = False  # no run.json: the trainer was guessed from the config's keys

    @property
    def kind(self) -> str | None:
        return KIND.get(self.method or "")

    @property
    def seed(self) -> int | None:
        return self.config.get("seed")


# ---- discovery and recognition -------------------------------------------------------------


def discover(paths: Sequence[str | Path], exclude: Path | None = None) -> list[Path]:
    """Every folder at or under ``paths`` holding a ``config.yaml`` (not inside a run's
    checkpoints, results, samples or model folders, nor ``exclude``), sorted."""
    found: set[Path] = set()
    skip = exclude.resolve() if exclude else None
    for root in map(Path, paths):
        if not root.is_dir():
            raise FileNotFoundError(f"{root}: no such folder")
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and (here / d).resolve() != skip)
            if "config.yaml" in files:
                found.add(here)
    return sorted(found)


class MalformedKey(ValueError):
    """A config key that recognition reads holds the wrong kind of value (``rl: 5``)."""


def section(config: dict[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` as a mapping (absent or empty: ``{}``); anything else is a
    ``MalformedKey`` naming the key and what it holds."""
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedKey(f"`{key}` must be a section (a mapping of keys), not {value!r:.60}")
    return value


TRAINERS = ("grpo", "eviback", "cer", "arco")  # run.json's methods (common.run.Run)


def recorded_trainer(run_dir: Path) -> str | None:
    """The trainer ``run_dir/run.json`` names (None: no run.json); an unreadable file or an
    unknown name is a ``MalformedKey``."""
    path = run_dir / RUN_FILE
    if not path.is_file():
        return None
    try:
        method = json.loads(path.read_text(encoding="utf-8")).get("method")
    except (OSError, ValueError, AttributeError) as err:
        raise MalformedKey(f"{RUN_FILE} unreadable: {err}") from None
    if method not in TRAINERS:
        raise MalformedKey(f"{RUN_FILE}: method {method!r:.60} is none of {', '.join(TRAINERS)}")
    return method


def guess_trainer(config: dict[str, Any], run_dir: Path) -> str | None:
    """The trainer whose config has these keys (a folder without run.json: a warmup, or a run
    written before run.json), or None."""
    assets = section(config, "assets")
    if "rubric" in config and "warmup_dir" in config:
        return "arco"
    if "reward" in config and "group_size" in config:
        if (run_dir / "model").is_dir() and not (run_dir / "checkpoints").is_dir():
            return "cer_warmup"
        return "cer"
    if "teacher" in config and "train" in assets:
        return "eviback"
    if "world" in assets and "questions_per_step" in config:
        return "grpo"
    if "world" in config and "batch_size" in config and "out" in config:
        return "warmup"
    return None


def recognise(
    config: dict[str, Any], run_dir: Path, trainer: str | None = None
) -> tuple[str, str] | None:
    """``(method, arm)`` of a run of ``trainer`` (run.json's; None: ``guess_trainer``), from
    its config, or None; a section that is not a mapping (``rl: 5``) or a ``method`` that is
    not a name is a ``MalformedKey``."""
    trainer = trainer or guess_trainer(config, run_dir)
    if trainer == "arco":
        chosen = config.get("method", "arco")  # older runs: outcome-only had rl.dense_steps=0
        if not isinstance(chosen, str):
            raise MalformedKey(f"`method` must be a name, not {chosen!r:.60}")
        if chosen == "arco" and section(config, "rl").get("dense_steps") == 0:
            chosen = "outcome_only"
        method = {"outcome_only": "arco_outcome_only", "prm": "arco_prm"}.get(chosen, "arco")
        return method, method
    if trainer == "cer":
        reward = section(config, "reward")
        fn = reward.get("fn") or ""  # reward.fn replaces the type's reward: label the run by it
        if not isinstance(fn, str):
            raise MalformedKey(f"`reward.fn` must be a name, not {fn!r:.60}")
        return "cer", f"cer/{fn.rpartition(':')[2] or reward.get('type', 'cer')}"
    if trainer == "eviback":
        method = "eviback" if section(config, "teacher").get("enabled", True) else "search_r1"
        return method, method
    if trainer in ("grpo", "warmup", "cer_warmup"):
        return trainer, trainer
    return None


def config_class(method: str) -> type:
    if method in ("grpo",):
        from common.search_grpo import GRPOConfig

        return GRPOConfig
    if method == "warmup":
        from common.warmup import WarmupConfig

        return WarmupConfig
    if method in ("eviback", "search_r1"):
        from eviback.config import EviBackConfig

        return EviBackConfig
    if method in ("cer", "cer_warmup"):
        from cer.config import CERConfig

        return CERConfig
    from arco.config import ArcoConfig

    return ArcoConfig


def load_run(path: Path, root: Path | None = None, step: int | None = None) -> Run:
    """The run at ``path``: its config read and checked against its trainer's dataclass, its
    method, and the model to evaluate; any problem is recorded, never raised."""
    from common.config import ConfigError, load_config

    base = root if root and path.is_relative_to(root) else Path.cwd()
    name = str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
    run = Run(path=path, name=name)
    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        run.problem = f"config.yaml unreadable: {str(err).splitlines()[0]}"
        return run
    if not isinstance(config, dict):
        run.problem = "config.yaml does not hold a mapping"
        return run
    run.config = config
    try:
        trainer = recorded_trainer(path)
    except MalformedKey as err:
        run.problem = str(err)
        return run
    try:
        found = recognise(config, path, trainer)
    except MalformedKey as err:
        run.problem = f"config.yaml: {err}"
        return run
    run.guessed = trainer is None and found is not None and found[0] not in WARMUPS
    if found is None:
        run.problem = "config.yaml matches no trainer (search_grpo, warmup, eviback, cer, arco)"
        return run
    run.method, run.arm = found
    try:
        load_config(config_class(run.method), path / "config.yaml")
    except ConfigError as err:
        run.problem = f"config.yaml no longer loads: {err}"
        return run
    except Exception as err:  # a value of a type the loader did not expect: listed, not raised
        run.problem = f"config.yaml no longer loads: {type(err).__name__}: {err}"
        return run
    run.model, run.problem = model_of(run, step)
    return run


def model_of(run: Run, step: int | None) -> tuple[Path | None, str | None]:
    """The folder to evaluate: a warmup's ``model/``; else ``checkpoints/step_<step>`` or the
    latest complete checkpoint."""
    from common.train import find_latest_checkpoint

    if run.method in ("warmup", "cer_warmup"):
        model = run.path / "model"
        ok = (model / "config.json").is_file()
        return (model, None) if ok else (None, f"no model at {model} (config.json missing)")
    if step is not None:
        ckpt = run.path / "checkpoints" / f"step_{step}"
        if (ckpt / "COMPLETE").is_file():
            return ckpt, None
        return None, f"no complete checkpoint {ckpt}"
    latest = find_latest_checkpoint(run.path)
    if latest is None:
        return None, f"no complete checkpoint under {run.path / 'checkpoints'} (not trained?)"
    return latest, None


def starting_model(run: Run) -> str | None:
    """The model a run started from (resolved), to pair it with the baseline that produced it."""
    c = run.config
    if run.method == "grpo":
        assets = c.get("assets") or {}
        start = assets.get("model") or str(Path(assets.get("world", "")) / "model")
    elif run.method in ("warmup", "cer_warmup"):
        return str((run.path / "model").resolve())
    else:
        start = (c.get("assets") or {}).get("model")
    return str(Path(start).resolve()) if start else None


def baseline_arms(run: Run) -> list[str]:
    """The arms each method is compared with, as in the papers and the compare specs: CER's
    rewards against the rule verifier (the paper's baseline) and exact match."""
    if run.method == "grpo":
        return ["warmup"]
    if run.method == "eviback":
        return ["search_r1"]
    if run.method == "arco":
        return ["arco_outcome_only"]
    if run.method == "cer" and run.arm != "cer/exact":
        return [arm for arm in ("cer/rule", "cer/exact") if arm != run.arm]
    return []


def search_benchmark(method: str, config: dict[str, Any]) -> tuple[str, Path]:
    """(name, file) a reference GRPO run or its warmup is evaluated on: the test split beside
    its train file, named for the folder above (``runs/smol/data/test.jsonl``: ``smol_test``),
    or the tiny world's (``tiny_test``) when the run trains on the world's own files."""
    source = (config.get("assets") or {}) if method == "grpo" else config
    train = source.get("train" if method == "grpo" else "train_data") or ""
    if not train:
        return "tiny_test", Path(source.get("world") or "runs/tinyworld/seed0") / "test.jsonl"
    test = Path(train).with_name("test.jsonl")
    return f"{test.parent.parent.name}_test", test


def benchmark_files(run: Run) -> dict[str, str]:
    """The files the run's evaluator reads, by benchmark name."""
    assets = run.config.get("assets") or {}
    if run.kind == "search":
        name, test = search_benchmark(run.method, run.config)
        return {name: str(test)}
    if run.kind in ("eviback", "cer"):
        return dict(assets.get("eval") or {})
    return dict(assets.get("eval") or {}) or {"dev": assets.get("dev", "")}


# ---- the cache and the evaluation ----------------------------------------------------------


def fingerprint(run: Run) -> str:
    """A hash of what the evaluation depends on: the method, the model folder's files (names,
    sizes, modification times), the run's config and the benchmark files' contents."""
    assert run.model is not None
    files = sorted(
        (p.relative_to(run.model).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in run.model.rglob("*")
        if p.is_file() and "state" not in p.relative_to(run.model).parts
    )
    payload = {
        "version": CACHE_VERSION,
        "method": run.method,
        "model": str(run.model.resolve()),
        "files": files,
        "config": (run.path / "config.yaml").read_text(encoding="utf-8"),
        "benchmarks": {k: file_digest(v) for k, v in benchmark_files(run).items()},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def file_digest(path: str) -> str | None:
    p = Path(path)
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.is_file() else None


def cache_dir(out: Path, run: Run) -> Path:
    where = run.path.resolve()
    where = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
    slug = re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(where)).strip("_") or "run"
    return out / "cache" / f"{slug}-{fingerprint(run)}"


Evaluator = Callable[[Run, Path], None]


def subprocess_evaluator(ranks: int = 1) -> Evaluator:
    """Run the package's evaluator in a fresh process (``--ranks`` > 1: under torchrun, for the
    evaluators that shard questions over ranks); its log is ``<folder>/eval.log``."""

    def evaluate(run: Run, folder: Path) -> None:
        cmd = [sys.executable]
        if ranks > 1:
            cmd += [
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(ranks),
                "--master_port",
                str(_free_port()),
            ]
        cmd += [
            "-m",
            "experiments.evaluate_all",
            "--worker",
            str(run.path),
            "--method",
            str(run.method),
            "--model",
            str(run.model),
            "--out",
            str(folder),
        ]
        with (folder / "eval.log").open("w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)

    return evaluate


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_record(path: Path) -> tuple[dict[str, Any] | None, str]:
    """A ``record.json``: ``(record, "")``, or ``(None, why)`` when it is not JSON (a write cut
    short) or not a record (``{"benchmarks": {name: {"rows": [{"id": ...}, ...]}}}``)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{type(err).__name__}: {err}"
    benchmarks = record.get("benchmarks") if isinstance(record, dict) else None
    if not isinstance(benchmarks, dict):
        return None, "no `benchmarks` mapping"
    for name, b in benchmarks.items():
        rows = b.get("rows") if isinstance(b, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
            return None, f"benchmark {name!r}: `rows` is not a list of per-question rows"
    return record, ""


def probing_retrieval(evaluator: Evaluator, servers: RetrievalServers | None = None) -> Evaluator:
    """``evaluator`` for the runs whose retrieval server answers (``retrieval_problem``, with
    ``servers`` to start a loopback one); any other run gets its one-line reason in
    ``error.txt`` and no engine."""

    def evaluate(run: Run, folder: Path) -> None:
        if why := retrieval_problem(run, servers):  # before an engine starts; the rest go on
            (folder / "error.txt").write_text(why + "\n")
            return
        evaluator(run, folder)

    return evaluate


def retrieval_problem(run: Run, servers: RetrievalServers | None = None) -> str:
    """Why ``run`` cannot be evaluated now for want of its retrieval server (the search agents'
    ``assets.retrieval_url`` that does not answer a query, and ``servers`` could not start), or
    ""."""
    url = (run.config.get("assets") or {}).get("retrieval_url") if run.kind != "cer" else ""
    if not url:
        return ""
    from common.retrieval.client import RetrievalError, probe_retrieval

    try:
        probe_retrieval(url)
        return ""
    except RetrievalError as e:
        why = f"its retrieval server does not answer ({' '.join(str(e).split())})"
    if servers is not None:
        return servers.start(url, why)
    return (
        f"{why}; start it (`make serve-retrieval INDEX=...`, docs/retrieval.md) and run eval-all "
        "again"
    )


class RetrievalServers:
    """Retrieval servers eval-all starts for its search runs: ``common.retrieval serve --index
    INDEX`` on the port of a loopback ``retrieval_url`` that does not answer, one per URL,
    waited for up to ``wait_s`` (a 65 GB index takes minutes to open), stopped by ``close``.
    Logs: ``<log_dir>/retrieval-<port>.log``."""

    def __init__(self, index: str | Path, log_dir: Path, wait_s: float = 1800.0, args=()):
        self.index, self.log_dir, self.wait_s = Path(index), log_dir, wait_s
        self.args = list(args)  # more ``serve`` flags (the tests: ``--bm25-backend numpy``)
        self.procs: dict[str, subprocess.Popen] = {}
        self.failed: dict[str, str] = {}

    def start(self, url: str, why: str) -> str:
        """Start a server for ``url`` (once); "" when it answers, else why not."""
        from urllib.parse import urlsplit

        from common.multinode import is_loopback

        if url in self.failed:
            return self.failed[url]
        if url in self.procs:
            return ""
        where = urlsplit(url)
        if not is_loopback(url):
            problem = f"{why}; it is not on this machine: start it on {where.hostname}"
        elif not self.index.exists():
            problem = (
                f"{why}; and --retrieval-index {self.index} is not there "
                "(`make data-index INDEX=...` makes Search-R1's, docs/retrieval.md)"
            )
        else:
            problem = self._serve(url, where.port or 80)
        if problem:
            self.failed[url] = problem
        return problem

    def _serve(self, url: str, port: int) -> str:
        from common.retrieval.client import RetrievalError, probe_retrieval

        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"retrieval-{port}.log"
        args = ["serve", "--index", str(self.index), "--host", "127.0.0.1", "--port", str(port)]
        print(f"[eval-all] starting the retrieval server on {self.index} for {url}", flush=True)
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "common.retrieval", *args, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.procs[url] = proc
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < self.wait_s:
            try:
                probe_retrieval(url)
                print(
                    f"[eval-all] retrieval server up in {time.monotonic() - t0:.0f} s", flush=True
                )
                return ""
            except RetrievalError:
                time.sleep(1.0)
        self.procs.pop(url)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            return f"the retrieval server eval-all started did not answer in {self.wait_s:.0f} s: {log_path}"
        return f"the retrieval server eval-all started exited ({proc.returncode}): {log_path}"

    def close(self) -> None:
        """Stop every server started."""
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def evaluate_runs(
    runs: Sequence[Run], out: Path, evaluator: Evaluator, force: bool = False
) -> dict[str, dict[str, Any]]:
    """Each evaluable run's record (``record.json`` in its cache folder: evaluated now, or read
    back when an earlier call evaluated the same checkpoint and config). A cached record that
    cannot be read is a miss: the run is evaluated again and a note says so (``run.notes``). A
    failed evaluation sets ``run.problem``. Returns ``{run name: record}``."""
    records: dict[str, dict[str, Any]] = {}
    todo = [r for r in runs if r.problem is None]
    for i, run in enumerate(todo, start=1):
        head = f"[eval-all] {i}/{len(todo)} {run.name} ({run.arm}, {run.model})"
        folder = cache_dir(out, run)
        record_file = folder / "record.json"
        if record_file.is_file() and not force:
            record, why = read_record(record_file)
            if record is not None:
                records[run.name] = record
                print(f"{head}: cached", flush=True)
                continue
            note = f"cached {record_file} unreadable ({' '.join(why.split())}): evaluated again"
            run.notes.append(note)
            print(f"{head}: {note}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"{head}: evaluating ...", flush=True)
        t0 = time.perf_counter()
        evaluator(run, folder)
        if record_file.is_file():
            record, why = read_record(record_file)
            if record is not None:
                records[run.name] = record
                print(f"[eval-all]   done in {time.perf_counter() - t0:.0f} s", flush=True)
                continue
            run.problem = f"evaluation wrote an unreadable {record_file}: " + " ".join(why.split())
            print(f"[eval-all]   {run.problem}", flush=True)
            continue
        error = folder / "error.txt"
        why = error.read_text().strip() if error.is_file() else f"no result; see {folder}/eval.log"
        run.problem = "evaluation failed: " + " ".join(why.split())
        print(f"[eval-all]   {run.problem}", flush=True)
    return records


# ---- the worker: one run, in its own process ----------------------------------------------


def worker(run_dir: Path, method: str, model: str, out: Path) -> dict[str, Any]:
    """Evaluate ``model`` as ``run_dir``'s method does; on the main rank write ``record.json``
    in ``out``: ``{benchmark: {"file", "rows": [per-question rows]}}``."""
    from common.config import load_config
    from common.train.distributed import current_rank

    cfg = load_config(config_class(method), run_dir / "config.yaml")
    kind = KIND[method]
    if kind == "search":
        benchmarks = _eval_search(cfg, method, model, out)
    elif kind == "eviback":
        benchmarks = _eval_eviback(cfg, model, out)
    elif kind == "cer":
        benchmarks = _eval_cer(cfg, model, out)
    else:
        benchmarks = _eval_arco(cfg, model, out)
    ranks = int(os.environ.get("WORLD_SIZE", "1"))  # the launcher's; 1 in a plain process
    record = {"method": method, "model": model, "ranks": ranks, "benchmarks": benchmarks}
    if current_rank() == 0:
        run = Run(
            path=run_dir,
            name=str(run_dir),
            config=yaml.safe_load((run_dir / "config.yaml").read_text()),
            method=method,
        )
        files = benchmark_files(run)
        for name, b in benchmarks.items():
            b.setdefault("file", files.get(name, ""))
            b["digest"] = file_digest(b["file"])
        write_atomic(out / "record.json", json.dumps(record, ensure_ascii=False))
    return record


def _eval_search(cfg: Any, method: str, model: str, out: Path) -> dict[str, Any]:
    """``common.rl_loop.evaluate`` on the test split beside the run's train file
    (``search_benchmark``; greedy, one rollout)."""
    from dataclasses import asdict

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.data import load_qa
    from common.retrieval.bm25 import BM25Retriever
    from common.retrieval.client import HTTPRetriever
    from common.rl_loop import EngineConfig, build_engine, evaluate
    from common.train.distributed import init_distributed

    world = Path(cfg.assets.world if method == "grpo" else cfg.world)
    name, test = search_benchmark(method, asdict(cfg))
    if method == "grpo":
        corpus = Path(cfg.path("corpus"))
    else:
        corpus = Path(cfg.corpus or world / "corpus.jsonl")
    url = cfg.assets.retrieval_url if method == "grpo" else ""
    for need in [test] + ([] if url else [corpus]):
        if not need.is_file():
            how = (
                f"build the world with `python -m common.tinyworld build --out {world}`"
                if name == "tiny_test"
                else "it is the test split beside the run's train file (SCALE=smol: make smol)"
            )
            raise FileNotFoundError(f"{need} not found; {how}")
    engine_cfg = cfg.engine if method == "grpo" else EngineConfig()
    rank, world_size, _ = init_distributed()
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model) if engine_cfg.backend == "hf" else None
    engine = build_engine(engine_cfg, model, hf, tokenizer, cfg.seed + rank)
    retriever = HTTPRetriever(url) if url else BM25Retriever.from_corpus(corpus)
    rows_file = out / "per_question" / f"{path_name(name, 'benchmark')}.jsonl"
    evaluate(
        engine,
        tokenizer,
        retriever,
        load_qa(test),
        cfg.agent,
        rank,
        world_size,
        results_path=rows_file,
    )
    if rank != 0:
        return {}
    rows = [json.loads(line) for line in rows_file.open(encoding="utf-8")]
    keep = ("id", "em", "f1", "valid", "searches", "forced")
    return {name: {"file": str(test), "rows": [{k: r[k] for k in keep} for r in rows]}}


def _eval_eviback(cfg: Any, model: str, out: Path) -> dict[str, Any]:
    """``eviback.evaluate.run_eval`` with the chosen model, writing under ``out``."""
    from eviback.evaluate import read_results, run_eval

    cfg.eval.model, cfg.eval.compare_to, cfg.run_dir = model, "", str(out)
    report = run_eval(cfg)
    if "summary" not in report:  # not the main rank
        return {}
    grouped: dict[str, list[dict]] = {}
    for r in read_results(out / "eval" / "per_question.jsonl"):
        grouped.setdefault(r.benchmark, []).append(
            {
                "id": r.id,
                "em": r.em,
                "f1": r.f1,
                "valid": r.valid,
                "searches": r.searches,
                "duplicates": r.duplicates,
                "forced": r.forced,
            }
        )
    return {
        name: {"file": cfg.assets.eval.get(name, ""), "rows": rows}
        for name, rows in grouped.items()
    }


def _eval_cer(cfg: Any, model: str, out: Path) -> dict[str, Any]:
    """``cer.evaluate.run_eval``: per problem the greedy verdict and the share of right samples
    (avg@k) by the rule verifier; on short free-form answers also the greedy answer's containment
    and F1."""
    from cer.evaluate import run_eval
    from common.train.distributed import current_rank

    cfg.eval.out = str(out / "eval")
    results = run_eval(cfg, model)  # every rank samples its share; rank 0 writes the rows
    if current_rank() != 0:
        return {}
    benchmarks = {}
    for name in results:
        record_file = out / "eval" / f"{path_name(name, 'assets.eval')}.json"
        record = json.loads(record_file.read_text(encoding="utf-8"))
        greedy = {r["id"]: r for r in record.get("greedy_rows", [])}
        rows = []
        for r in record["sampled_rows"]:
            row = {"id": r["id"], "avg@k": sum(r["correct"]) / max(len(r["correct"]), 1)}
            if r["id"] in greedy:
                g = greedy[r["id"]]
                row["greedy"] = float(g["correct"][0])
                row |= {f"greedy_{k}": float(g[k][0]) for k in ("contains", "f1") if k in g}
            rows.append(row)
        k = len(record["sampled_rows"][0]["correct"]) if record["sampled_rows"] else cfg.eval.k
        benchmarks[name] = {"file": record["file"], "rows": rows, "k": k}
    return benchmarks


def _eval_arco(cfg: Any, model: str, out: Path) -> dict[str, Any]:
    """``arco.evaluate.run_eval`` on the chosen checkpoint's policy."""
    from arco.evaluate import run_eval

    report = run_eval(cfg, checkpoint=model, out=out / "eval")
    if not report.get("main", True):
        return {}
    benchmarks = {}
    for name in report["results"]:
        path = out / "eval" / "per_question" / f"{path_name(name, 'assets.eval')}.jsonl"
        rows = [json.loads(line) for line in path.open(encoding="utf-8")]
        keep = ("id", "em", "f1", "valid", "searches", "forced")
        benchmarks[name] = {"rows": [{k: r[k] for k in keep} for r in rows]}
    return benchmarks


# ---- statistics ----------------------------------------------------------------------------


def metric_value(rows: Sequence[dict], metric: str) -> float:
    """The metric over ``rows``: a mean of a per-question field, or a ratio of two sums."""
    num, den = DEFINITIONS[metric]
    top = sum(float(r[num]) for r in rows)
    if den is None:
        return top / len(rows)
    bottom = sum(float(r[den]) for r in rows)
    return top / bottom if bottom else 0.0


def bootstrap_interval(
    rows: Sequence[dict],
    metric: str,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``metric`` over questions drawn with replacement
    (``common.bootstrap.ratio_interval``: a ratio of sums, or a mean)."""
    num, den = DEFINITIONS[metric]
    top = [float(r[num]) for r in rows]
    bottom = None if den is None else [float(r[den]) for r in rows]
    return ratio_interval(top, bottom, resamples, confidence, seed)


# CER's headline number: the mean over its six benchmarks of each one's avg@k (k = 16 on the four
# maths benchmarks, one sample on MMLU-Pro and SuperGPQA in the paper configs)
CER_SIX = ("math500", "amc23", "aime24", "aime25", "mmlu_pro", "supergpqa")
MEAN_OF_SIX = "mean of 6"


def mean_over_benchmarks(
    rows_by_benchmark: Sequence[Sequence[dict]], field: str, resamples: int, seed: int = 0
) -> dict[str, float]:
    """The unweighted mean over benchmarks of each one's mean ``field``, with a percentile
    bootstrap interval that redraws each benchmark's questions on their own."""
    rng = np.random.default_rng(seed)
    values, draws = [], np.zeros(resamples)
    for rows in rows_by_benchmark:
        x = np.array([float(r[field]) for r in rows])
        values.append(x.mean())
        draws += x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(1)
    draws = np.sort(draws / len(values))
    lo, hi = draws[int(0.025 * resamples)], draws[min(int(0.975 * resamples), resamples - 1)]
    return {"value": float(np.mean(values)), "ci_low": float(lo), "ci_high": float(hi)}


def summarize_record(record: dict[str, Any], kind: str, resamples: int) -> dict[str, Any]:
    """``{benchmark: {"n", "file", "digest", "metrics": {m: {value, ci_low, ci_high}}}}``; a CER
    run evaluated on its six benchmarks also gets ``"mean of 6"`` (avg@k), its paper's number."""
    out = {}
    for name, b in record["benchmarks"].items():
        rows = b["rows"]
        metrics = {}
        for m in COLUMNS[kind]:
            if not rows or any(DEFINITIONS[m][0] not in r for r in rows):
                continue
            lo, hi = bootstrap_interval(rows, m, resamples)
            metrics[m] = {"value": metric_value(rows, m), "ci_low": lo, "ci_high": hi}
        out[name] = {
            "n": len(rows),
            "file": b.get("file", ""),
            "digest": b.get("digest"),
            "metrics": metrics,
            **({"k": b["k"]} if "k" in b else {}),
        }
    benchmarks = record["benchmarks"]
    if kind == "cer" and all(benchmarks.get(name, {}).get("rows") for name in CER_SIX):
        six = [benchmarks[name]["rows"] for name in CER_SIX]
        if all("avg@k" in r for rows in six for r in rows):
            out[MEAN_OF_SIX] = {
                "n": sum(len(rows) for rows in six),
                "file": "",
                "digest": None,
                "metrics": {"avg@k": mean_over_benchmarks(six, "avg@k", resamples)},
            }
    return out


def pick_baseline(run: Run, candidates: Sequence[Run]) -> Run | None:
    """Among evaluated runs of the baseline arm: the one that produced this run's starting model,
    then the same seed, then the first by name."""
    start = starting_model(run)

    def rank(c: Run) -> tuple[bool, bool, str]:
        produced = c.method in ("warmup", "cer_warmup") and starting_model(c) == start
        same_start = starting_model(c) == start
        return (not (produced or same_start), c.seed != run.seed, c.name)

    return min(candidates, key=rank) if candidates else None


def paired_comparisons(
    runs: Sequence[Run], records: dict[str, dict], resamples: int
) -> list[dict[str, Any]]:
    """Each run against its baseline per benchmark both evaluated on the same file's questions:
    Δ = run − baseline per question, ``common.bootstrap.paired_bootstrap`` over questions."""
    out = []
    evaluated = [r for r in runs if r.name in records]
    arms = [(r, arm) for r in evaluated for arm in baseline_arms(r)]
    for run, arm in arms:
        candidates = [c for c in evaluated if c.arm == arm]
        for bench, b in records[run.name]["benchmarks"].items():
            mine = {r["id"]: r for r in b["rows"]}
            same = [
                c
                for c in candidates
                if bench in records[c.name]["benchmarks"]
                and records[c.name]["benchmarks"][bench].get("digest") == b.get("digest")
                and {r["id"] for r in records[c.name]["benchmarks"][bench]["rows"]} == set(mine)
            ]
            base = pick_baseline(run, same)
            if base is None:
                continue
            theirs = {r["id"]: r for r in records[base.name]["benchmarks"][bench]["rows"]}
            for metric in PAIRED[run.kind or ""]:
                field_ = DEFINITIONS[metric][0]
                if any(field_ not in r for r in [*mine.values(), *theirs.values()]):
                    continue
                diffs = [float(mine[q][field_]) - float(theirs[q][field_]) for q in mine]
                out.append(
                    {
                        "run": run.name,
                        "baseline": base.name,
                        "benchmark": bench,
                        "metric": metric,
                        **paired_bootstrap(diffs, resamples),
                    }
                )
    return out


# ---- the report ----------------------------------------------------------------------------


def load_published(root: Path) -> dict[str, Any]:
    """Each package's ``published.yaml`` (the papers' tables), by package; absent ones skipped."""
    out = {}
    for package, rel in PUBLISHED_FILES.items():
        path = root / rel
        if path.is_file():
            out[package] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return out


def beside_published(
    runs: Sequence[Run], report_runs: Sequence[dict], published: dict[str, Any]
) -> list[dict[str, Any]]:
    """Measured cells whose run started from the model a published row names, with the same
    method and benchmark (a table with a ``metric``; rows labelled ``"<model> <method>"``)."""
    by_name = {r.name: r for r in runs}
    out = []
    for entry in report_runs:
        if "benchmarks" not in entry:  # not evaluated (its config may not even be readable)
            continue
        run = by_name[entry["run"]]
        start = (run.config.get("assets") or {}).get("model")
        for package, doc in published.items():
            for table in doc.get("tables", []):
                metric = table.get("metric")
                for label, values in table["rows"].items():
                    model, _, method = label.rpartition(" ")
                    if not metric or model != start or method != run.arm:
                        continue
                    for bench, b in entry.get("benchmarks", {}).items():
                        if bench in table["columns"] and metric in b["metrics"]:
                            value = values[table["columns"].index(bench)]
                            out.append(
                                {
                                    "run": run.name,
                                    "benchmark": bench,
                                    "metric": metric,
                                    "measured": b["metrics"][metric],
                                    "published": value,
                                    "source": f"{doc.get('paper', package)}, {table['source']}",
                                }
                            )
    return out


def build_report(
    runs: Sequence[Run], records: dict[str, dict], resamples: int, published: dict[str, Any]
) -> dict[str, Any]:
    rows = []
    for run in runs:
        entry: dict[str, Any] = {
            "run": run.name,
            "path": str(run.path),
            "method": run.method,
            "arm": run.arm,
            "model": str(run.model) if run.model else None,
            "problem": run.problem,
            "notes": list(run.notes),
        }
        if run.name in records and run.kind:
            entry["benchmarks"] = summarize_record(records[run.name], run.kind, resamples)
        rows.append(entry)
    return {
        "unreadable_cache_records": sum(len(r.notes) for r in runs),
        "trainer_guessed": sum(r.guessed for r in runs),
        "beside_published": beside_published(runs, rows, published),
        "resamples": resamples,
        "confidence": 0.95,
        "runs": rows,
        "comparisons": paired_comparisons(runs, records, resamples),
        "published": published,
    }


def _cell(m: dict[str, float] | None) -> str:
    if m is None:
        return ""
    return f"{m['value']:.3f} [{m['ci_low']:.3f}, {m['ci_high']:.3f}]"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Evaluation of every run",
        "",
        f"Measured here. Each cell: value [95% percentile bootstrap over questions, "
        f"{report['resamples']} draws]. Rates are over questions, except the duplicate-query "
        "rate (duplicates / searches).",
        "",
        "## Runs",
        "",
        "| run | method | model | status |",
        "|---|---|---|---|",
    ]
    for r in report["runs"]:
        status = "evaluated" if "benchmarks" in r else f"not evaluated: {r['problem']}"
        status += "".join(f"; {n}" for n in r.get("notes", []))
        lines.append(f"| {r['run']} | {r['arm'] or '?'} | {r['model'] or ''} | {status} |")
    for kind, title in TITLES.items():
        members = [r for r in report["runs"] if "benchmarks" in r and KIND[r["method"]] == kind]
        if not members:
            continue
        cols = COLUMNS[kind]
        ks = {b.get("k") for r in members for b in r["benchmarks"].values()} - {None}
        note = f" (avg@k: k = {', '.join(map(str, sorted(ks)))})" if ks else ""
        lines += [
            "",
            f"## {title}{note}",
            "",
            "| run | method | benchmark | n | " + " | ".join(cols) + " |",
            "|---|---|---|---|" + "---|" * len(cols),
        ]
        for r in members:
            for bench, b in r["benchmarks"].items():
                cells = [_cell(b["metrics"].get(c)) for c in cols]
                lines.append(
                    f"| {r['run']} | {r['arm']} | {bench} | {b['n']} | " + " | ".join(cells) + " |"
                )
    if report["comparisons"]:
        lines += [
            "",
            "## Against the baseline (paired bootstrap over the same questions)",
            "",
            "Δ = run − baseline per question; 95% percentile interval; MDE = 2.8 SE.",
            "",
            "| run | baseline | benchmark | metric | n | Δ | 95% CI | P(Δ* ≤ 0) | MDE |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for c in report["comparisons"]:
            lines.append(
                f"| {c['run']} | {c['baseline']} | {c['benchmark']} | {c['metric']} | {c['n']} | "
                f"{c['delta']:+.3f} | [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | "
                f"{c['p_le_0']:.3f} | {c['mde']:.3f} |"
            )
    if report.get("beside_published"):
        lines += [
            "",
            "## Measured beside published (same starting model, method, benchmark)",
            "",
            "| run | benchmark | metric | measured [95% CI] | published | source |",
            "|---|---|---|---|---|---|",
        ]
        for b in report["beside_published"]:
            lines.append(
                f"| {b['run']} | {b['benchmark']} | {b['metric']} | "
                f"{_cell(b['measured'])} | {b['published']} (published) | "
                f"{b['source']} |"
            )
    lines += published_markdown(report.get("published") or {})
    return "\n".join(lines) + "\n"


def published_markdown(published: dict[str, Any]) -> list[str]:
    """The papers' tables, each under its source; never in the measured tables above."""
    if not published:
        return []
    lines = ["", "## Published (the papers' numbers, not measured here)"]
    for package, doc in published.items():
        for table in doc.get("tables", []):
            cols = table["columns"]
            lines += [
                "",
                f"### {package}: {table['title']}",
                "",
                f"Source: {table.get('paper', doc.get('paper', ''))}, {table['source']}. "
                f"Setting: {table.get('setting', '')}",
                "",
                "| " + " | ".join(["row", *cols]) + " |",
                "|---|" + "---|" * len(cols),
            ]
            for row, values in table["rows"].items():
                cells = ["" if v is None else str(v) for v in values]
                lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def write_report(report: dict[str, Any], out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    (out / "results.md").write_text(text, encoding="utf-8")
    (out / "results.json").write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return text


def evaluate_all(
    paths: Sequence[str | Path],
    out: Path,
    evaluator: Evaluator,
    step: int | None = None,
    resamples: int = 10_000,
    project_root: Path | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Discover, recognise, evaluate (or read from the cache) and report; returns the report."""
    one = Path(paths[0]) if len(paths) == 1 else None  # names relative to it, else to the cwd
    root = one.resolve() if one and not (one / "config.yaml").is_file() else None
    runs = [load_run(p.resolve(), root, step) for p in discover(paths, exclude=out)]
    print(
        f"[eval-all] {len(runs)} run folder(s); {sum(r.problem is None for r in runs)} to evaluate",
        flush=True,
    )
    records = evaluate_runs(runs, out, evaluator)
    redone = sum(len(r.notes) for r in runs)
    if redone:
        print(f"[eval-all] {redone} unreadable cache record(s) evaluated again", flush=True)
    guessed = sum(r.guessed for r in runs)
    if guessed:
        print(
            f"[eval-all] {guessed} run folder(s) without run.json: trainer guessed from the "
            "config's keys",
            flush=True,
        )
    report = build_report(runs, records, resamples, load_published(project_root or Path.cwd()))
    write_report(report, out)
    if plots:
        from experiments.evaluate_plots import plot_benchmarks, plot_curves

        plot_benchmarks(report, out)
        plot_curves(runs, out / "curves.png")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.evaluate_all",
        description="Evaluate every run's final checkpoint on its method's benchmarks; one "
        "table with bootstrap intervals, paired comparisons with baselines, published numbers.",
    )
    parser.add_argument(
        "paths", nargs="*", default=["runs"], help="run folders or folders of runs (default: runs)"
    )
    parser.add_argument("--out", default="runs/eval", help="report and cache folder")
    parser.add_argument(
        "--step", type=int, default=None, help="evaluate checkpoints/step_N instead of the latest"
    )
    parser.add_argument("--ranks", type=int, default=1, help="ranks per evaluation (torchrun)")
    parser.add_argument(
        "--retrieval-index",
        help="an index folder to serve when a search run's loopback retrieval server is down",
    )
    parser.add_argument("--resamples", type=int, default=10_000, help="bootstrap draws")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker_main(args)
    out = Path(args.out)
    servers = RetrievalServers(args.retrieval_index, out) if args.retrieval_index else None
    evaluator = probing_retrieval(subprocess_evaluator(args.ranks), servers)
    try:
        evaluate_all(args.paths, out, evaluator, args.step, args.resamples, plots=not args.no_plots)
    except (FileNotFoundError, ValueError) as err:
        print(f"eval-all: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the disk: full, read-only (one line naming the path)
        if (line := write_failure(err)) is None:
            raise
        print(f"eval-all: error: {line}", file=sys.stderr)
        return 2
    finally:
        if servers is not None:
            servers.close()
    print(f"[eval-all] wrote {args.out}/results.md, results.json")
    return 0


def _worker_main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        worker(Path(args.worker), args.method, args.model, out)
    except Exception as err:  # the parent lists the run with this reason and goes on
        traceback.print_exc()
        (out / "error.txt").write_text(f"{type(err).__name__}: {err}\n")
        return 2
    return 0


if __name__ == "__main__":
    from common.train.distributed import exit_process

    exit_process(main())
