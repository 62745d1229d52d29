"""The rehearsal of one paper config: stand-ins prepared, servers up, each stage a user would run
(``python -m <package> <stage> --config <paper config> [overrides]``) run in turn, a report.

Only these differ from the paper run: the model (``standin``), the data (``assets``), retrieval
(``common.retrieval serve`` on loopback over a stand-in corpus, dense where the config is),
the LLM endpoints (``endpoint``, with a share of malformed answers, 5xx and timeouts), the sizes
(``SIZES``: steps, questions per step, evaluation sizes) and what applies only on a GPU
(``GPU_ONLY``). Everything else is the paper config's: lengths and budgets, dtype, ZeRO stage,
gradient checkpointing, LoRA, KL and loss settings, sampling.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.rehearse.precision import cpu_bf16, read_cpuinfo
from experiments.rehearse.stages import (
    Stage,
    StageFailed,
    StageResult,
    free_port,
    last_error_line,
    metric_sum,
    overrides,
    read_jsonl,
    run_stage,
)
from experiments.rehearse.tokens import markdown_rows, token_table
from experiments.rehearse.walk import (
    SKIPPED,
    background,
    make_argv,
    make_vars,
    runs_through_make,
    without_make_env,
)

ROOT = Path(__file__).resolve().parents[2]
PAPER_CONFIGS: tuple[str, ...] = (
    "eviback/configs/qwen3_0.6b.yaml",
    "eviback/configs/qwen3_1.7b.yaml",
    "eviback/configs/qwen3_4b.yaml",
    "cer/configs/qwen3_4b_base_math.yaml",
    "cer/configs/qwen3_4b_base_webinstruct.yaml",
    "cer/configs/qwen3_8b_base_math.yaml",
    "cer/configs/qwen3_8b_base_webinstruct.yaml",
    "arco/configs/qwen3_4b_hotpotqa.yaml",
    "arco/configs/qwen3_4b_2wiki.yaml",
    "arco/configs/qwen3_4b_musique.yaml",
    "arco/configs/llama3.2_3b_hotpotqa.yaml",
    "arco/configs/llama3.2_3b_2wiki.yaml",
    "arco/configs/llama3.2_3b_musique.yaml",
)
ARCO_VARIANT_CONFIG = "arco/configs/qwen3_4b_hotpotqa.yaml"  # the config the variants rehearse on
PLAN_RANKS = 8  # the memory plan's GPUs: one node (the configs' batch sizes are global)
DATA_ROWS = 16  # training rows per data file: the rehearsal's steps draw a few of them
# The teacher and annotator clients' timeout in the rehearsal: the endpoint's "timeout" answers
# wait longer than this, so the client's timeout path runs without minutes of waiting.
CLIENT_TIMEOUT_S = 1.5
# The resume stage extends the run by a step, as a user continues a finished run: the step count
# is a setting, so the run folder's settings check needs leave to change it.
EXTEND = {"allow_config_change": True}
# The stand-in endpoint's answers that break the contract or fail: each client's counted
# fallback runs, and the valid path stays the common one.
ENDPOINT_SHARES = {
    "malformed": 0.08,
    "bad_body": 0.02,
    "http_500": 0.04,
    "http_503": 0.02,
    "timeout": 0.02,
    "timeout_delay_s": CLIENT_TIMEOUT_S + 2,
}


def model_names(raw: Any) -> list[str]:
    """Every ``*_model`` string of a raw config (the LLM endpoints' models), in order."""
    if isinstance(raw, dict):
        own = [v for k, v in raw.items() if k.endswith("_model") and isinstance(v, str)]
        return own + [n for v in raw.values() for n in model_names(v)]
    return [n for v in raw for n in model_names(v)] if isinstance(raw, list) else []


STANDIN_CONTROLLER = "standin-controller"  # E2E-APE's controller where the config names none


class RehearsalError(RuntimeError):
    """The rehearsal could not be set up (before any stage ran)."""


class SetupFailed(RuntimeError):
    """A README step before the stages failed (``Report.setup`` names it and why)."""


def family(config: str | Path) -> str:
    """The method package a config belongs to, from its folder (``eviback/configs/...``)."""
    parts = Path(config).resolve().relative_to(ROOT).parts if Path(config).is_absolute() else None
    first = (parts or Path(config).parts)[0]
    if first not in ("eviback", "cer", "arco"):
        raise RehearsalError(f"{config}: not a config of eviback/, cer/ or arco/")
    return first


def check_standin(config: str | Path, raw: dict[str, Any]) -> None:
    """Refuse a config whose model has no stand-in, before anything is built: a rehearsal shrinks
    a paper model (Qwen3, Llama 3.2) to run its pipeline here; a config on a local model folder
    (the smol tier's SmolLM2) already runs for real on a CPU, so there is nothing to rehearse."""
    from experiments.rehearse.tokenizers import model_facts

    model_id = str(raw["assets"]["model"])
    try:
        model_facts(model_id)
    except ValueError as e:
        hint = ""
        if Path(model_id).is_absolute() or model_id.count("/") != 1 or (ROOT / model_id).exists():
            hint = (
                "; it is a local model folder: run the config itself (e.g. SCALE=smol: make "
                "train-<method> SCALE=smol)"
            )
        raise RehearsalError(f"{config}: assets.model: {e}{hint}") from None


def loaded_config(config: Path, variant: str | None) -> dict[str, Any]:
    """The config as its trainer builds it (defaults filled in, the variant applied), as a dict."""
    from common.config import config_to_dict

    return config_to_dict(config_object(config, variant))


def config_object(config: Path, variant: str | None) -> Any:
    """The config dataclass as its trainer builds it (defaults filled in, the variant applied)."""
    from common.config import load_config

    fam = family(config)
    if fam == "arco":
        from arco.variants import load_variant

        return load_variant(str(ROOT / config), [], variant)
    if fam == "eviback":
        from eviback.config import EviBackConfig as cls
    else:
        from cer.config import CERConfig as cls
    return load_config(cls, ROOT / config)


def memory_plan(config: Path, variant: str | None, ranks: int = PLAN_RANKS) -> str:
    """The paper run's memory plan per rank on ``ranks`` GPUs (80 GB and 141 GB), as markdown;
    a plan that cannot be made is one line saying why (the rehearsal goes on)."""
    from common.train.memory_plan import MemoryPlanError, plan_for_run

    label = str(config) + (f" --variant {variant}" if variant else "")
    try:
        return plan_for_run(config_object(config, variant), ranks, label=label).format()
    except (MemoryPlanError, ValueError) as e:
        return f"No memory plan: {e}"


def rehearsal_name(config: str | Path, variant: str | None) -> str:
    return Path(config).stem + (f"-{variant}" if variant else "")


@dataclass
class Setup:
    """What a family's plan needs: the config, the prepared stand-ins and the servers' URLs."""

    config: Path
    raw: dict[str, Any]
    variant: str | None
    ranks: int
    out: Path
    device: str
    model_dir: Path
    data: dict[str, Any]
    retrieval_url: str | None
    endpoint_url: str
    stats: Callable[[], dict[str, Any]]
    notes: list[str] = field(default_factory=list)  # what was changed for the CPU, and why
    make_vars: dict[str, str] | None = None  # METHOD, SCALE... that pick the config (None: none)

    @property
    def runs(self) -> Path:
        return self.out / "runs"


# ----------------------------------------------------------------------------- per-family plans


def _common(s: Setup) -> dict[str, Any]:
    """Overrides every trainer of the rehearsal takes: stand-in model, seed kept, GPU-only off."""
    values: dict[str, Any] = {"assets.model": str(s.model_dir), **s.data}
    engine = s.raw.get("engine", {})
    if s.device == "cpu" and engine.get("sleep_during_update"):
        values["engine.sleep_during_update"] = False
    bf16 = s.raw.get("train", {}).get("bf16", "auto")
    if s.device == "cpu" and bf16 is not False:  # bf16 where the CPU computes it (precision.py)
        values["train.bf16"] = cpu_bf16(bf16, read_cpuinfo())[0]
    return values


def _endpoint_delta(s: Setup, before: dict[str, Any]) -> dict[str, Any]:
    after = s.stats()
    delta: dict[str, Any] = {}
    for contract, outcomes in after.get("by_contract", {}).items():
        old = before.get("by_contract", {}).get(contract, {})
        for outcome, n in outcomes.items():
            d = n - old.get(outcome, 0)
            if d:
                delta[f"endpoint/{contract}/{outcome}"] = d
    return delta


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise StageFailed(f"{path} was not written")
    return [r for r in read_jsonl(path) if "loss" in r or "reward" in r]


def _require(counts: dict[str, Any], key: str, what: str) -> None:
    if not counts.get(key):
        raise StageFailed(f"{what} never ran ({key} = {counts.get(key, 0)})")


def _via_make(s: Setup, target: str, variant: bool = True, **extra: str) -> dict[str, str] | None:
    """The make variables that run ``target`` on this config with the stage's overrides in
    ``ARGS`` (plus ``extra``), or None where the target takes no ``ARGS`` (or no SCALE picks the
    config): then the stage runs the command the target runs."""
    if s.make_vars is None:
        return None
    values = {k: v for k, v in s.make_vars.items() if variant or k != "VARIANT"}
    if not runs_through_make(target, tuple(sorted(values.items())), _relative(s.config)):
        return None
    return values | extra


def _relative(config: Path) -> str:
    path = Path(config)
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    return str(path)


def _policy_used(run: Path, policy: Path) -> dict[str, Any]:
    """The run folder's record of the teacher's policy file: E2E-APE's, byte for byte."""
    record = run / "teacher_policy.json"
    if not record.is_file():
        raise StageFailed(f"{record} was not written: training did not use the E2E-APE policy")
    used = json.loads(record.read_text())
    sha = hashlib.sha256(policy.read_bytes()).hexdigest()
    if Path(used.get("file", "")).resolve() != policy.resolve() or used.get("sha256") != sha:
        raise StageFailed(f"{record} names {used}, not the E2E-APE policy {policy} ({sha[:12]})")
    return {"teacher_policy_file": used["file"]}


def _from_warmup(run: Path, warmup: Path) -> dict[str, Any]:
    """ARCO's run started from ``warmup``: its config.yaml names it, its arco.json is there."""
    import yaml

    settings = yaml.safe_load((run / "config.yaml").read_text())
    if Path(settings.get("warmup_dir", "")).resolve() != warmup.resolve():
        raise StageFailed(f"{run}/config.yaml's warmup_dir is {settings.get('warmup_dir')!r}")
    if not (warmup / "arco.json").is_file() or not (run / "run.json").is_file():
        raise StageFailed(f"{warmup}/arco.json or {run}/run.json is missing")
    return {"warmup_dir": str(warmup)}


# metrics reported as the mean step's (rewards, CER's scores, ARCO's dense-phase rows)
RATES = (
    "reward", "cer/", "advantage", "mixed_", "phase_dense", "criteria_valid", "decomposition",
    "step_score/", "valid_answer", "invalid_turns", "mean_searches",
)  # fmt: skip


def _train_counts(run_dir: Path, steps: int) -> dict[str, Any]:
    rows = _metrics(run_dir)
    counts: dict[str, Any] = {"steps_logged": len(rows)}
    if len(rows) < steps:
        raise StageFailed(f"{run_dir}/metrics.jsonl has {len(rows)} training steps of {steps}")
    counts["nonzero_grad_steps"] = sum(1 for r in rows if r.get("grad_norm", 0) > 0)
    counts["response_tokens_mean"] = metric_sum(rows, "response_tokens") / max(len(rows), 1)
    for key in sorted({k for r in rows for k in r}):
        if key.startswith("teacher/") and not key.endswith(("_s", "rate", "share")):
            counts[key] = metric_sum(rows, key)  # counts: summed over the steps
        elif key.startswith(RATES):
            counts[key] = metric_sum(rows, key) / len(rows)  # rates: the mean step's
    ckpt = run_dir / "checkpoints"
    counts["checkpoints"] = sorted(p.name for p in ckpt.glob("step_*")) if ckpt.is_dir() else []
    if not counts["checkpoints"]:
        raise StageFailed(f"no checkpoint under {ckpt}")
    return counts


def _tokens(s: Setup, run_dir: Path, first: int = 1) -> dict[str, Any]:
    """``tokens``: the steps from ``first`` on, measured next to the cost model (``tokens``)."""
    rows = [r for r in _metrics(run_dir) if r.get("step", 0) >= first]
    return {"tokens": token_table(rows, family(s.config), s.raw)}


def _resume_stage(
    s: Setup, package: str, train: dict[str, Any], run: Path, via: Stage | None = None
) -> Stage:
    """The train command once more with ``train``'s one step more (the config change allowed):
    it must continue from the train stage's checkpoint and log step 3 alone. ``via``: the train
    stage whose make target it runs too."""
    log = s.out / "logs" / "resume.log"
    args = _args(s, "train", train | EXTEND)
    check = _resume_check(s, run, log, 3, first=3)
    stage = Stage("resume", package, args, s.ranks, check, readme=False)
    if via is not None:
        stage.make, stage.make_vars = via.make, via.make_vars
    return stage


def _resume_check(
    s: Setup, run_dir: Path, log: Path, steps: int, first: int
) -> Callable[[], dict[str, Any]]:
    """The resume stage's check; its tokens are those of the steps from ``first`` on."""

    def check() -> dict[str, Any]:
        text = log.read_text(errors="replace")
        if "resumed from" not in text:
            raise StageFailed("the second start did not resume from the checkpoint")
        counts = _train_counts(run_dir, steps)
        logged = [r["step"] for r in _metrics(run_dir)]
        if logged != list(range(1, steps + 1)):
            raise StageFailed(f"metrics.jsonl's steps after the resume are {logged}")
        return counts | _tokens(s, run_dir, first)

    return check


def _args(s: Setup, stage: str, values: dict[str, Any]) -> list[str]:
    args = [stage, "--config", str(s.config)]
    if s.variant:
        args += ["--variant", s.variant]
    return args + overrides(values)


def _sources(files: Any, split: str) -> list[str]:
    """EviBack's source names of ``assets.<split>``: a mapping's keys; one file is ``split``."""
    if isinstance(files, dict):
        return list(files)
    return [split] if files else []


def eviback_plan(s: Setup) -> list[Stage]:
    run = s.runs / "eviback"
    ape_dir = run / "ape"
    files = s.raw["assets"]
    base = _common(s) | {
        "run_dir": str(run),
        "assets.retrieval_url": s.retrieval_url,
        "assets.teacher_endpoint": s.endpoint_url,
        "assets.controller_endpoint": s.endpoint_url,
        "assets.controller_model": files.get("controller_model") or STANDIN_CONTROLLER,
        "assets.train_quotas": {k: 4 for k in _sources(files.get("train"), "train")},
        "assets.eval_quotas": {k: 2 for k in files.get("eval", {})},
        "teacher.timeout": CLIENT_TIMEOUT_S,
        "teacher.retries": 1,
        "teacher.backoff": 0.05,  # the failure paths run; the rehearsal does not sleep through them
        "questions_per_step": 2 * s.ranks,
        "eval_questions": 2,
        "eval_every": 2,
        "save_every": 1,
    }
    ape = base | {
        "ape.questions": 4,
        "ape.rollouts": 2,
        "ape.candidates_a": 2,
        "ape.candidates_b": 2,
        "ape.gated_from_top": 1,
        "ape.repeats": 1,
        "ape.out": str(ape_dir),
    }
    policy = ape_dir / "policy.yaml"
    # through make, APE_POLICY= passes the policy (teacher.policy_file) as the README's run does
    train_make = _via_make(s, "train-eviback", APE_POLICY=str(policy))
    train = base | {"steps": 2}
    if train_make is None:
        train["teacher.policy_file"] = str(policy)
    marks: dict[str, Any] = {}

    def mark() -> None:
        marks["before"] = s.stats()

    def ape_check() -> dict[str, Any]:
        if not (ape_dir / "policy.yaml").is_file():
            raise StageFailed(f"{ape_dir}/policy.yaml was not written")
        return _endpoint_delta(s, marks.pop("before", {}))

    def train_check() -> dict[str, Any]:
        counts = _train_counts(run, 2) | _endpoint_delta(s, marks.pop("before", {}))
        _require(counts, "teacher/calls", "the teacher backoff")
        return counts | _policy_used(run, policy) | _tokens(s, run)

    wait = _wait_stage(s, base)
    ape_stage = Stage("ape", "eviback", _args(s, "ape", ape), 1, ape_check, before=mark)
    ape_stage.make, ape_stage.make_vars = "ape-eviback", _via_make(s, "ape-eviback")
    train_stage = Stage(
        "train",
        "eviback",
        _args(s, "train", train),
        s.ranks,
        train_check,
        before=mark,
        make="train-eviback",
        make_vars=train_make,
    )
    evaluate = Stage("eval", "eviback", _args(s, "eval", base), s.ranks, _eval_check(run / "eval"))
    evaluate.make, evaluate.make_vars = "eval-eviback", _via_make(s, "eval-eviback")
    return [
        wait,
        ape_stage,
        train_stage,
        _resume_stage(s, "eviback", train | {"steps": 3}, run, train_stage),
        evaluate,
    ]


def cer_plan(s: Setup) -> list[Stage]:
    run = s.runs / "cer"
    base = _common(s) | {
        "run_dir": str(run),
        "prompts_per_step": s.ranks,  # one group a rank: its update dominates a CPU step
        "eval_questions": 2,
        "eval_every": 2,
        "save_every": 1,
        "eval.k": 2,
    }

    def train_check() -> dict[str, Any]:
        counts = _train_counts(run, 2)
        _require(counts, "reward/cer", "CER's scoring of answers")
        _require(counts, "mixed_group_share", "a group with non-zero advantages")
        _require(counts, "nonzero_grad_steps", "an update with a non-zero gradient")
        return counts | _tokens(s, run)

    train = Stage("train", "cer", _args(s, "train", base | {"steps": 2}), s.ranks, train_check)
    train.make, train.make_vars = "train-cer", _via_make(s, "train-cer")
    evaluate = Stage("eval", "cer", _args(s, "eval", base), s.ranks, _eval_check(run / "eval"))
    evaluate.make, evaluate.make_vars = "eval-cer", _via_make(s, "eval-cer")
    return [train, _resume_stage(s, "cer", base | {"steps": 3}, run, train), evaluate]


def arco_plan(s: Setup) -> list[Stage]:
    run = s.runs / "arco"
    marks: dict[str, Any] = {}
    base = _common(s) | {
        "run_dir": str(run),
        "warmup_dir": str(run / "warmup"),
        "assets.teacher_endpoint": s.endpoint_url,
        "assets.annotator_endpoint": s.endpoint_url,
        "eval_questions": 2,
        "eval_every": 2,
        "save_every": 1,
        "rl.sparse_questions": 2 * s.ranks,
        # one batch size for the run (the trainer's check): dense = sparse questions x sparse_n
        "rl.dense_questions": 2 * s.ranks * int(s.raw["rl"]["sparse_n"]),
        "diagnose.questions": 2,
        "diagnose.samples": 2,
    }
    if s.retrieval_url:
        base["assets.retrieval_url"] = s.retrieval_url
    warmup = base | {
        "warmup.questions": 4,
        "warmup.samples": 2,
        "warmup.select_questions": 2,
        "warmup.pi_epochs": 1,
        "warmup.mu_epochs": 1,
        "warmup.teacher_timeout_s": CLIENT_TIMEOUT_S,
        "warmup.teacher_backoff_s": 0.05,
        # the rehearsal's own cache: every rehearsal sends the teacher's requests it checks
        "warmup.api_cache_dir": str(run / "llm_cache"),
    }
    train = base | {"rl.sparse_steps": 1, "rl.dense_steps": 1}

    def mark() -> None:
        marks["before"] = s.stats()

    def warmup_check() -> dict[str, Any]:
        meta = run / "warmup" / "arco.json"
        if not meta.is_file():
            raise StageFailed(f"{meta} was not written")
        return _endpoint_delta(s, marks.pop("before", {}))

    def train_check() -> dict[str, Any]:
        counts = _train_counts(run, 2)
        if s.raw.get("method") != "outcome_only":  # the baseline has no μ
            _require(counts, "phase_dense", "a dense step (μ's rubric rows scored)")
        _require(counts, "nonzero_grad_steps", "an update with a non-zero gradient")
        return counts | _from_warmup(run, run / "warmup") | _tokens(s, run)

    base_warmup = []
    if s.variant and s.raw.get("warmup", {}).get("policy_from"):
        # the variant's warmup starts from the config's own π warmup, as a user runs them
        args = ["warmup", "--config", str(s.config), *overrides(warmup)]
        base_vars = _via_make(s, "warmup-arco", variant=False)
        base_warmup = [
            Stage(
                "base-warmup",
                "arco",
                args,
                s.ranks,
                None,
                make="warmup-arco",
                make_vars=base_vars,
                readme=False,
            )
        ]
    warm = Stage("warmup", "arco", _args(s, "warmup", warmup), s.ranks, warmup_check, before=mark)
    warm.make, warm.make_vars = "warmup-arco", _via_make(s, "warmup-arco")
    trained = Stage("train", "arco", _args(s, "train", train), s.ranks, train_check)
    trained.make, trained.make_vars = "train-arco", _via_make(s, "train-arco")
    evaluate = Stage("eval", "arco", _args(s, "eval", base), s.ranks, _eval_check(run / "eval"))
    evaluate.make, evaluate.make_vars = "eval-arco", _via_make(s, "eval-arco")
    return [
        *base_warmup,
        warm,
        trained,
        _resume_stage(s, "arco", train | {"rl.dense_steps": 2}, run, trained),
        evaluate,
        Stage("diagnose", "arco", _args(s, "diagnose", base), 1, None, readme=False),
    ]


WAIT_S = 300  # the rehearsal's bound for make wait-services (the stand-ins answer in seconds)
ALWAYS = ("wait-services",)  # stages that run whatever --stage picks: the later ones need them


def _wait_stage(s: Setup, values: dict[str, Any]) -> Stage:
    """``make wait-services`` with the run's own overrides (its URLs), as the README waits for
    the services started in the background; it must see each answer."""
    args = ["--config", str(s.config), "--wait-s", str(WAIT_S), *overrides(values)]
    log = s.out / "logs" / "wait-services.log"

    def check() -> dict[str, Any]:
        answered = [ln for ln in log.read_text().splitlines() if ln.startswith("[wait] ")]
        if not any(" all " in ln and "answer" in ln for ln in answered):
            raise StageFailed(f"make wait-services did not see every service answer: {answered}")
        return {"answered": sum(ln.endswith(" s)") and "answers" in ln for ln in answered)}

    make_vars = _via_make(s, "wait-services", WAIT_S=str(WAIT_S))
    if make_vars is not None:
        args = ["--config", str(s.config), *overrides(values)]
    return Stage(
        "wait-services",
        "experiments.wait_services",
        args,
        1,
        check,
        timeout_s=WAIT_S + 60,
        make="wait-services",
        make_vars=make_vars,
    )


def _eval_check(folder: Path) -> Callable[[], dict[str, Any]]:
    def check() -> dict[str, Any]:
        found = sorted(folder.glob("*.json")) if folder.is_dir() else []
        if not found:
            raise StageFailed(f"no evaluation written under {folder}")
        return {"eval_files": [p.name for p in found]}

    return check


def _eval_all_stage(s: Setup) -> Stage:
    """``experiments.evaluate_all`` over the rehearsal's runs, as ``make eval-all`` runs it."""
    out = s.out / "eval-all"

    def check() -> dict[str, Any]:
        runs = json.loads((out / "results.json").read_text())["runs"]
        missing = [f"{r['run']}: {r['problem']}" for r in runs if "benchmarks" not in r]
        if not runs or missing:
            raise StageFailed(f"eval-all evaluated no run ({missing or 'none found'})")
        return {"runs_evaluated": len(runs)}

    args = [str(s.runs), "--out", str(out), "--no-plots", "--ranks", str(s.ranks)]
    return Stage("eval-all", "experiments.evaluate_all", args, 1, check, readme=False)


PLANS = {"eviback": eviback_plan, "cer": cer_plan, "arco": arco_plan}


def readme_walk(s: Setup) -> list[str]:
    """The README's make targets a whole rehearsal of ``s``'s config runs, in order: ``make
    data``, EviBack's index and retrieval server, then its stages' own."""
    fam = family(s.config)
    before = ["data"] + (["data-index", "serve-retrieval"] if fam == "eviback" else [])
    return before + [st.make for st in PLANS[fam](s) if st.readme and st.make]


STAGES = {
    "eviback": ("wait-services", "ape", "train", "resume", "eval", "eval-all"),
    "cer": ("train", "resume", "eval", "eval-all"),
    "arco": ("base-warmup", "warmup", "train", "resume", "eval", "diagnose", "eval-all"),
}

# ----------------------------------------------------------------------------- the whole run


@dataclass
class Report:
    config: str
    variant: str | None
    ranks: int
    device: str
    stages: list[StageResult] = field(default_factory=list)
    # the README's steps before the stages: data, data-index, serve-retrieval, wait-services
    setup: list[StageResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_exercised: list[str] = field(default_factory=list)
    endpoint: dict[str, Any] = field(default_factory=dict)
    standin: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    memory_plan: str = ""  # the paper run's GPU memory per rank (common.train.memory_plan)

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(r.ok for r in [*self.setup, *self.stages])

    @property
    def failed(self) -> list[str]:
        return [r.name for r in [*self.setup, *self.stages] if not r.ok]

    @property
    def walk(self) -> list[str]:
        """The README's make targets this rehearsal ran, in order."""
        return [r.make for r in [*self.setup, *self.stages] if r.make]

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stages"] = [r.as_dict() for r in self.stages]
        d["setup"] = [r.as_dict() for r in self.setup]
        d["ok"] = self.ok
        d["walk"] = self.walk
        return d

    def markdown(self) -> str:
        head = f"# Rehearsal of `{self.config}`" + (
            f" --variant {self.variant}" if self.variant else ""
        )
        lines = [
            head,
            "",
            f"{'PASSED' if self.ok else 'FAILED: ' + ', '.join(self.failed)}; device {self.device},"
            f" {self.ranks} rank(s), {self.seconds:.0f} s.",
            "",
            "| stage | make | result | time (s) | peak memory (MiB) | counts |",
            "|---|---|---|---:|---:|---|",
        ]
        for r in [*self.setup, *self.stages]:
            counts = ", ".join(f"{k} {_short(v)}" for k, v in r.counts.items() if k != "tokens")
            result = "ok" if r.ok else f"FAILED: {r.error}"
            make = f"`make {r.make}`" if r.make else "(rehearsal)"
            if r.make and not r.command.startswith("make "):
                make += ", its command"  # the target takes no ARGS= for the stand-ins yet
            lines.append(
                f"| {r.name} | {make} | {result} | {r.seconds:.1f} | {r.peak_rss_mib:.0f} "
                f"| {counts} |"
            )
        lines += ["", "## The README's One paper run, as walked", ""]
        lines.append("Ran, in order: " + ", ".join(f"`make {t}`" for t in self.walk) + ".")
        lines += [f"Not run: `make {t}`: {why}." for t, why in SKIPPED.items()]
        lines += ["", "## Tokens through the model, next to the cost model", ""]
        tables = [(r.name, r.counts["tokens"]) for r in self.stages if r.counts.get("tokens")]
        if tables:
            lines += [
                "Measured: the trainers' `tokens/*` metrics summed over the stage's steps; cost "
                "model: `benchmarks/cost_model.py` `step_tokens` for each step's logged shapes "
                "(`shape/*`); ratio = measured / cost model.",
                "",
                "| stage | steps | category | measured | cost model | ratio | note |",
                "|---|---|---|---:|---:|---:|---|",
            ]
            for name, table in tables:
                lines += markdown_rows(name, table)
        else:
            lines.append("No train stage logged `tokens/*` metrics (a run from before them).")
        if self.memory_plan:
            lines += ["", f"## GPU memory plan of the paper run ({PLAN_RANKS} ranks)", ""]
            lines += [self.memory_plan]
        lines += ["", "## The stand-in", ""]
        lines += [f"- {k}: {_short(v)}" for k, v in self.standin.items()]
        lines += ["", "## Changed for this machine", ""] + [f"- {n}" for n in self.notes]
        lines += ["", "## Not exercised", ""] + [f"- {n}" for n in self.not_exercised]
        lines += ["", "## The stand-in endpoint (requests by contract and outcome)", ""]
        for contract, outcomes in self.endpoint.get("by_contract", {}).items():
            seen = ", ".join(f"{k} {v}" for k, v in outcomes.items() if v)
            if seen:
                lines.append(f"- {contract}: {seen}")
        lines += ["", "Logs: `logs/<stage>.log`; commands and all counts in `report.json`.", ""]
        return "\n".join(lines)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


NOT_EXERCISED_CPU = [
    "CUDA kernels, flash attention and NCCL: the stand-in runs on CPU (gloo between ranks)",
    "engine.gpu_memory_utilization: vLLM on a CPU sizes its KV cache by engine.kv_cache_mib",
    "the real weights, their memory and their speed: the stand-in has 2 layers and random weights",
]


def rehearse(
    config: str | Path,
    variant: str | None = None,
    ranks: int = 1,
    out: str | Path | None = None,
    extra: dict[str, list[str]] | None = None,
    stages: list[str] | None = None,
) -> Report:
    """Prepare the stand-ins, start the servers, run every stage, write report.md and .json."""
    config = Path(config)
    fam = family(config)
    if variant and fam != "arco":
        raise RehearsalError("--variant applies to ARCO configs only")
    unknown = sorted(set(stages or ()) - set(STAGES[fam]))
    if unknown:
        raise RehearsalError(f"unknown stage(s) {unknown}; {fam} has {list(STAGES[fam])}")
    raw = loaded_config(config, variant)
    check_standin(config, raw)
    name = rehearsal_name(config, variant) + (f"-r{ranks}" if ranks > 1 else "")
    out = Path(out) if out else ROOT / "runs" / "rehearse" / name
    device = "cuda" if _cuda() else "cpu"
    t0 = time.perf_counter()
    if not stages:  # a whole rehearsal starts from nothing (a rerun's runs would resume)
        for sub in ("runs", "logs", "eval-all"):
            shutil.rmtree(out / sub, ignore_errors=True)
    report = Report(str(config), variant, ranks, device)
    report.memory_plan = memory_plan(config, variant)
    print(f"[rehearse] {name}: memory plan of the paper run on {PLAN_RANKS} GPUs:", flush=True)
    print(report.memory_plan, flush=True)
    try:
        with _prepared(config, raw, variant, ranks, out, device, report) as setup:
            _run_plan(setup, fam, name, stages, extra, report, out, device)
    except SetupFailed:  # the report names the step; its services are stopped
        pass
    report.seconds = time.perf_counter() - t0
    write_report(report, out)
    return report


def _run_plan(
    setup: Setup,
    fam: str,
    name: str,
    stages: list[str] | None,
    extra: dict[str, list[str]] | None,
    report: Report,
    out: Path,
    device: str,
) -> None:
    """Run the family's stages (``stages`` of them, and ``ALWAYS``) in order, to the first
    failure; the endpoint's counts and the notes into ``report``."""
    plan = PLANS[fam](setup) + [_eval_all_stage(setup)]
    if stages:
        unknown = sorted(set(stages) - {st.name for st in plan})
        if unknown:
            raise RehearsalError(f"unknown stage(s) {unknown}; {fam} has {[s.name for s in plan]}")
        plan = [st for st in plan if st.name in stages or st.name in ALWAYS]
    env = _stage_env(device)
    for stage in plan:
        stage.args += (extra or {}).get(stage.name, [])
        if stage.before:
            stage.before()
        print(f"[rehearse] {name}: {stage.name} ...", flush=True)
        result = run_stage(stage, out / "logs" / f"{stage.name}.log", ROOT, env)
        report.stages.append(result)
        state = "ok" if result.ok else f"FAILED ({result.error})"
        print(f"[rehearse] {name}: {stage.name} {state} in {result.seconds:.0f} s", flush=True)
        if not result.ok:
            break  # later stages read what this one writes
    report.endpoint = setup.stats()
    report.notes = setup.notes


def write_report(report: Report, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n")
    (out / "report.md").write_text(report.markdown())


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # a broken torch is the stages' error to report
        return False


def _stage_env(device: str) -> dict[str, str]:
    env = without_make_env(dict(os.environ))  # make rehearse's variables stay out
    env.setdefault("OPENAI_API_KEY", "rehearsal")  # the stand-in endpoint ignores it
    env["HF_HUB_OFFLINE"] = "1"  # the stand-ins are local folders: nothing to download
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@contextlib.contextmanager
def _prepared(
    config: Path, raw: dict, variant: str | None, ranks: int, out: Path, device: str, report: Report
) -> Iterator[Setup]:
    """The stand-in model, data, corpus and servers of one rehearsal, stopped on exit."""
    from experiments.rehearse import assets as standin_assets
    from experiments.rehearse.endpoint import serve_endpoint

    fam = family(config)
    out.mkdir(parents=True, exist_ok=True)
    cache = ROOT / "runs" / "rehearse" / ".cache"
    model_id = raw["assets"]["model"]
    model_dir, info = build_model(fam, raw, model_id, out / "model", cache)
    report.standin = info
    writer = {
        "eviback": standin_assets.eviback_data,
        "cer": standin_assets.cer_data,
        "arco": standin_assets.arco_data,
    }[fam]
    standins = writer(raw, out, DATA_ROWS)  # files under out/data/
    t0 = time.perf_counter()
    data, made = _through_make_data(config, raw, standins, model_dir, out)
    notes = [made] if made else []
    if made:
        report.setup.append(
            StageResult(
                "data",
                True,
                time.perf_counter() - t0,
                0.0,
                str(out / "logs" / "data.log"),
                0,
                command="experiments.prepare_data.prepare (make data's code) on a "
                "stand-in hub into the rehearsal's folder",
                make="data",
            )
        )
    if device == "cpu" and raw.get("engine", {}).get("sleep_during_update"):
        notes.append(
            "engine.sleep_during_update=false: vLLM refuses sleep mode on a CPU ('Sleep mode is "
            "not supported on current platform'); not exercised"
        )
    if device == "cpu":
        bf16_note = cpu_bf16(raw.get("train", {}).get("bf16", "auto"), read_cpuinfo())[1]
        notes += [bf16_note] if bf16_note else []
    report.not_exercised = list(NOT_EXERCISED_CPU) if device == "cpu" else []
    needs_retrieval = fam == "eviback" or raw.get("env", {}).get("setting") not in (
        None,
        "distractor",
    )
    try:
        make = make_vars(_relative(config), variant)
    except ValueError:
        make = None  # a config no SCALE picks: its stages run the commands make would run
    env = _stage_env(device)
    with contextlib.ExitStack() as stack:
        url = None
        if needs_retrieval:
            server = _retrieval_server(out / "corpus", cache, fam == "eviback", report, env)
            url = stack.enter_context(server)
        served = [*model_names(raw), STANDIN_CONTROLLER]  # what the clients' probes look for
        endpoint_url = stack.enter_context(serve_endpoint(**ENDPOINT_SHARES, seed=0, served=served))
        stats = _stats_reader(endpoint_url)
        yield Setup(
            config,
            raw,
            variant,
            ranks,
            out,
            device,
            model_dir,
            data,
            url,
            endpoint_url,
            stats,
            notes,
            make,
        )


def _through_make_data(
    config: Path, raw: dict, standins: dict[str, str], model_dir: Path, out: Path
) -> tuple[dict[str, str], str]:
    """The data files as ``make data`` makes them: the stand-ins laid out as a hub
    (``assets.standin_hub``), then ``experiments.prepare_data.prepare`` (``make data``'s code)
    into ``out/project`` (its output in ``logs/data.log``). Returns the overrides, each key with
    a source pointing at the file made for it, and a line for the report; a config without
    ``assets.sources`` keeps the stand-ins as written ("")."""
    from common.config import load_config
    from experiments.prepare_data import SAMPLE, FolderHub, config_class, data_keys, prepare
    from experiments.rehearse import assets as standin_assets

    sources = raw["assets"].get("sources") or {}
    if not sources:
        return standins, ""
    hub, project, log = out / "hub", out / "project", out / "logs" / "data.log"
    for folder in (hub, project):
        shutil.rmtree(folder, ignore_errors=True)
    models = {raw["assets"][k]: model_dir for k in ("model", "init_model") if raw["assets"].get(k)}
    standin_assets.standin_hub(sources, standins, hub, models)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        code = prepare(config, FolderHub(hub), root=project)
    if code != 0:
        raise RehearsalError(f"make data on the stand-in hub exited {code}: see {log}")
    keys = data_keys(load_config(config_class(config), str(config)).assets)
    made = {f"assets.{k}": str(project / path) for k, path in keys.items() if k in sources}
    sampled = sum(bool(SAMPLE.fullmatch(sources[k])) for k in keys if k in sources)
    line = (
        f"data: {len(set(made.values()))} file(s) made by `make data` (experiments.prepare_data) "
        f"from a stand-in hub of the config's {len(sources)} source(s)"
        + (f", {sampled} key(s) drawn by its seeded rule" if sampled else "")
        + f"; {log}"
    )
    return standins | made, line


def _stats_reader(base_url: str) -> Callable[[], dict[str, Any]]:
    import httpx

    root = base_url.removesuffix("/v1")

    def stats() -> dict[str, Any]:
        return httpx.get(f"{root}/stats", timeout=10).json()

    return stats


def build_model(
    fam: str, raw: dict, model_id: str, out: Path, cache: Path
) -> tuple[Path, dict[str, Any]]:
    """The stand-in of ``model_id``, scripted with its method's texts (``scripts``)."""
    import torch

    from experiments.rehearse import assets as standin_assets
    from experiments.rehearse import scripts
    from experiments.rehearse.standin import build_standin, chain_from_paths
    from experiments.rehearse.tokenizers import standin_tokenizer

    tok = standin_tokenizer(model_id, cache / "tokenizers")
    answers = list(standin_assets.QA_ANSWERS)
    if fam == "cer":
        script, protocol = scripts.math_script(standin_assets.MATH_ANSWERS), None
    elif fam == "arco":
        script = scripts.react_script(answers, int(raw.get("rubric", {}).get("k", 3)))
        protocol = raw.get("agent", {}).get("protocol", "react")
    else:
        script = scripts.search_r1_script(answers)
        protocol = raw.get("agent", {}).get("protocol", "search_r1")
    chain = chain_from_paths(scripts.script_paths(tok, script, protocol))
    path = build_standin(
        model_id, out, chain=chain, default=tok.eos_token_id, dtype=torch.bfloat16, tokenizer=tok
    )
    info_file = path / "standin.json"
    info = json.loads(info_file.read_text()) if info_file.is_file() else {"model_id": model_id}
    info["script"] = [f"{where}: {text!r} ({weight:g})" for text, weight, where in script]
    return path, info


@contextlib.contextmanager
def _retrieval_server(
    folder: Path, cache: Path, dense: bool, report: Report, env: dict[str, str]
) -> Iterator[str]:
    """The retrieval server over the stand-in corpus, stopped on exit. Dense (EviBack's) as the
    README runs it: the stand-in E5 index laid out as Search-R1's hub files, ``make data-index``
    from them, then ``make serve-retrieval INDEX=... ENCODER=... &`` (``make wait-services``, a
    stage, waits for it). BM25: ``common.retrieval serve`` on the corpus, waited for here."""
    from common.retrieval.doc_store import read_config
    from experiments.rehearse import assets as standin_assets

    corpus = standin_assets.standin_corpus(folder)
    index = folder / ("index-dense" if dense else "index-bm25")
    logs, port = folder.parent / "logs", free_port()
    py = sys.executable
    if dense:
        if not (index / "manifest.json").exists():
            encoder = standin_assets.standin_e5_encoder(folder / "e5")
            subprocess.run(
                [
                    py,
                    "-m",
                    "common.retrieval",
                    "index",
                    "--corpus",
                    str(corpus),
                    "--out",
                    str(index),
                    "--dense-encoder",
                    str(encoder),
                ],
                check=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        hub = folder / "search_r1_hub"
        encoder = search_r1_hub(corpus, index, Path(read_config(index)["encoder"]), hub)
        search_r1 = folder / "search_r1"
        shutil.rmtree(search_r1, ignore_errors=True)
        args = ["--search-r1-index", str(search_r1), "--hub", str(hub)]
        stage = Stage(
            "data-index",
            "experiments.prepare_data",
            args,
            check=_index_check(search_r1, index, corpus),
            make="data-index",
            make_vars={"INDEX": str(search_r1), "HUB": str(hub)},
        )
        result = run_stage(stage, logs / "data-index.log", ROOT, env)
        report.setup.append(result)
        if not result.ok:
            raise SetupFailed(f"make data-index: {result.error}")
        values = {"INDEX": str(search_r1), "HOST": "127.0.0.1", "PORT": str(port)}
        argv = make_argv("serve-retrieval", values | {"ENCODER": str(encoder)})
    else:
        argv = [
            py,
            "-m",
            "common.retrieval",
            "serve",
            "--port",
            str(port),
            "--index",
            str(index),
            "--corpus",
            str(corpus),
        ]
    log = logs / "serve-retrieval.log"
    result = StageResult(
        "serve-retrieval",
        True,
        0.0,
        0.0,
        str(log),
        command=shlex.join(argv),
        make="serve-retrieval" if dense else "",
    )
    report.setup.append(result)
    with background(argv, log, env) as proc:
        result.counts["pgid"] = proc.pid  # its process group, stopped on exit
        try:
            if not dense:  # no make wait-services in this method's README: waited for here
                _wait_health(f"http://127.0.0.1:{port}/health", proc, log)
            yield f"http://127.0.0.1:{port}/retrieve"
        finally:
            if proc.poll() is not None:  # it stopped before the rehearsal did
                result.ok = False
                result.error = f"exit status {proc.returncode}: {last_error_line(log)}"


def search_r1_hub(corpus: Path, index: Path, encoder: Path, hub: Path) -> Path:
    """Lay a stand-in dense index out in ``hub`` as the hub holds Search-R1's (``make
    data-index``'s sources: the flat index in parts, the corpus gzipped, e5-base-v2's folder);
    returns the encoder's folder there."""
    from common.retrieval.dense import INDEX_FILE
    from experiments.prepare_data import SEARCH_R1_ENCODER, SEARCH_R1_INDEX, FolderHub

    folder = FolderHub(hub)
    data = (index / INDEX_FILE).read_bytes()
    parts = SEARCH_R1_INDEX["e5_Flat.index"]
    size = -(-len(data) // len(parts))
    for i, src in enumerate(parts):
        place = folder.place(src)
        place.parent.mkdir(parents=True, exist_ok=True)
        place.write_bytes(data[i * size : (i + 1) * size])
    (src,) = SEARCH_R1_INDEX["wiki-18.jsonl"]
    place = folder.place(src)
    place.parent.mkdir(parents=True, exist_ok=True)
    place.write_bytes(gzip.compress(corpus.read_bytes(), mtime=0))
    target = hub / SEARCH_R1_ENCODER
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(encoder, target)
    return target


def _index_check(search_r1: Path, index: Path, corpus: Path) -> Callable[[], dict[str, Any]]:
    """``make data-index`` joined the parts into the stand-in's index and corpus, byte for byte."""
    from common.retrieval.dense import INDEX_FILE

    def check() -> dict[str, Any]:
        made = search_r1 / "e5_Flat.index"
        if not made.is_file() or made.read_bytes() != (index / INDEX_FILE).read_bytes():
            raise StageFailed(f"{made} is not the stand-in index joined from its parts")
        if (search_r1 / "wiki-18.jsonl").read_bytes() != corpus.read_bytes():
            raise StageFailed(f"{search_r1}/wiki-18.jsonl is not the stand-in corpus")
        return {"index_bytes": made.stat().st_size}

    return check


def _wait_health(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RehearsalError(f"the retrieval server exited: see {log}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RehearsalError(f"the retrieval server did not answer {url} in {timeout_s:.0f} s")
