"""`cer eval`: accuracy by the rule verifier (letter match for multiple choice, the alias oracle
on the alias task's rows), avg@k and greedy, beside exact-match accuracy.

    python -m cer eval --config cer/configs/tiny.yaml [--model PATH] [key=value ...]

For each benchmark of ``assets.eval``: k samples per problem (temperature 0.6, top-p 0.95,
top-k 20 by default) give avg@k (mean accuracy over all samples) and pass@k; one greedy sample
gives greedy accuracy; ``exact_avg@k`` and ``greedy_exact`` are the same by exact match against the
reference, so the share of right answers in another form is their gap. Written to ``<run_dir>/eval/`` (or ``eval.out``): ``<name>.json`` per
benchmark (metrics and each problem's answers), ``results.json`` and ``results.md``.
The model is ``--model``, else the run's latest checkpoint, else ``assets.model``.

Under the DeepSpeed launcher (or torchrun) each rank joins the process group (its own GPU, by
``LOCAL_RANK``), builds its own engine and samples every world-th problem; the rows are gathered
back into the benchmark's order, every rank gets the same metrics, and rank 0 writes and prints.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from cer.config import AssetsConfig, CERConfig, check_assets
from cer.data import MathExample, load_math_examples, webinstruct_paper_filter
from cer.prompt import prompt_ids
from cer.rewards.groups import (
    DEFAULT_RULES,
    Rules,
    group_verdicts,
    is_exact,
    rules_of,
    verifier_name,
)
from cer.rollout import sample_groups
from common.config import path_name
from common.data import question_char_limit
from common.metrics import cover_exact_match, f1_score
from common.rl_loop import build_engine, gather_in_order
from common.rollout.engine import GenerationEngine, SamplingConfig
from common.train import find_latest_checkpoint
from common.train.distributed import init_distributed
from common.train.logging import generation_progress

log = logging.getLogger(__name__)


def load_problems(
    path: str, tokenizer: Any, max_prompt_tokens: int, fmt: str = "auto", filt: str = "none"
) -> tuple[list[MathExample], list[list[int]]]:
    """Examples of ``path`` and their prompt ids; prompts over ``max_prompt_tokens`` are left
    out with a warning that counts them (the paper drops them too). A problem over
    ``question_char_limit(max_prompt_tokens)`` characters is left out before it is tokenized
    (``load_math_examples``' ``max_chars``: counted in its own warning)."""
    examples = load_math_examples(path, fmt, max_chars=question_char_limit(max_prompt_tokens))
    examples = examples.examples
    if filt == "webinstruct_paper":
        examples = webinstruct_paper_filter(examples)
    kept, prompts = [], []
    for ex in examples:
        ids = prompt_ids(tokenizer, ex)
        if len(ids) <= max_prompt_tokens:
            kept.append(ex)
            prompts.append(ids)
    if len(kept) < len(examples):
        log.warning(
            "%s: %d of %d prompts longer than %d tokens left out",
            path,
            len(examples) - len(kept),
            len(examples),
            max_prompt_tokens,
        )
    if not kept:
        raise ValueError(f"{path}: no problem left (filter {filt!r}, max {max_prompt_tokens})")
    return kept, prompts


def evaluate_problems(
    engine: GenerationEngine,
    tokenizer: Any,
    examples: Sequence[MathExample],
    prompts: Sequence[list[int]],
    params: SamplingConfig,
    rules: Rules = DEFAULT_RULES,
    desc: str | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """``params.n`` samples per problem: accuracy (rule / letter; mean over all samples, i.e.
    avg@n), pass@n, exact-match accuracy and the share of samples with a boxed answer; and one
    row per problem (its gold, answers, verdicts and exact matches). Short-answer QA rows also
    get token F1 and containment (the normalised gold inside the normalised answer), which judge
    free-form answers that exact match misses. ``desc``: a bar of the samples done on stderr
    while they are drawn (``generation_progress``; rank 0); None: none."""
    with generation_progress(engine, desc) if desc else nullcontext():
        groups = sample_groups(engine, tokenizer, examples, prompts, params, group_prefix="eval:")
    rows = []
    for g in groups:
        answers = [s.answer for s in g.splits]
        row = {
            "id": g.example.id,
            "gold": g.example.answer,
            "answers": answers,
            "correct": group_verdicts(g, tokenizer, rules),
            "exact": [is_exact(s.answer, g.example) for s in g.splits],
        }
        if g.example.metadata.get("short_answer"):
            row["f1"] = [f1_score(a, g.example.answer) for a in answers]
            row["contains"] = [cover_exact_match(a, g.example.answer) for a in answers]
        rows.append(row)
    return row_metrics(rows, params.n), rows


def row_metrics(rows: Sequence[dict], n: int) -> dict[str, float]:
    """``evaluate_problems``' metrics of its rows (``n`` samples each)."""
    samples = max(len(rows) * n, 1)
    return {
        "accuracy": sum(sum(r["correct"]) for r in rows) / samples,
        f"pass@{n}": sum(any(r["correct"]) for r in rows) / max(len(rows), 1),
        "exact_accuracy": sum(sum(r["exact"]) for r in rows) / samples,
        "boxed_rate": sum(a is not None for r in rows for a in r["answers"]) / samples,
        "problems": len(rows),
    } | {
        name: sum(sum(r[key]) for r in rows) / samples
        for name, key in (("f1", "f1"), ("containment", "contains"))
        if rows and all(key in r for r in rows)
    }


def evaluate_sharded(
    engine: GenerationEngine,
    tokenizer: Any,
    examples: Sequence[MathExample],
    prompts: Sequence[list[int]],
    params: SamplingConfig,
    rules: Rules,
    rank: int,
    world: int,
    desc: str | None = None,
) -> tuple[dict[str, float], list[dict]]:
    """``evaluate_problems`` on this rank's problems (``[rank::world]``; a collective when
    ``world`` > 1: every rank calls it), with every rank's rows gathered back into the order of
    ``examples`` and the metrics of them all. ``desc``: rank 0's bar of its samples."""
    mine = slice(rank, None, world)
    _, rows = evaluate_problems(
        engine, tokenizer, examples[mine], prompts[mine], params, rules, desc
    )
    rows = gather_in_order(rows, world)
    return row_metrics(rows, params.n), rows


def problem_results(rows: Sequence[dict]) -> list[dict]:
    """One-sample rows of ``evaluate_problems`` as per-problem results (``experiments.compare``'s
    input): ``{id, correct, exact, boxed, valid, answer}``; ``correct`` is the task's verifier
    (the alias oracle on alias rows), ``valid`` = ``boxed`` (the field compare reports); short
    free-form answers also ``contains`` and ``f1``."""
    out = []
    for r in rows:
        (answer,), (correct,), (exact,) = r["answers"], r["correct"], r["exact"]
        boxed = answer is not None
        result = {
            "id": r["id"],
            "correct": bool(correct),
            "exact": bool(exact),
            "boxed": boxed,
            "valid": boxed,
            "answer": answer,
        }
        out.append(result | {k: r[k][0] for k in ("contains", "f1") if k in r})
    return out


def resolve_model(model: str | None, run_dir: str | Path, assets: AssetsConfig) -> str:
    """``model``, else the latest checkpoint in ``run_dir``, else ``assets.model``."""
    if model:
        return model
    latest = find_latest_checkpoint(run_dir)
    return str(latest) if latest is not None else assets.model


def run_eval(cfg: CERConfig, model: str | None = None) -> dict[str, dict[str, float]]:
    """Evaluate one model on every benchmark; returns {benchmark: metrics} (on every rank of a
    launcher's run, which share the problems; rank 0 writes the files)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = resolve_model(model, cfg.run_dir, cfg.assets)
    cfg.assets.model = model_path
    check_assets(cfg.assets, ["model", "eval"])
    for name in cfg.assets.eval:  # each becomes <out>/<name>.json: checked before a model loads
        path_name(name, "assets.eval")
    rank, world, _ = init_distributed()  # sets this rank's CUDA device before any model loads
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    hf_model = None
    if cfg.engine.backend == "hf":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto").to(device).eval()
    engine = build_engine(cfg.engine, model_path, hf_model, tokenizer, cfg.seed + rank)
    torch.manual_seed(cfg.seed + rank)
    out = Path(cfg.eval.out or Path(cfg.run_dir) / "eval")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float]] = {}
    for name, path in cfg.assets.eval.items():
        examples, prompts = load_problems(path, tokenizer, cfg.max_prompt_tokens)
        if cfg.eval.max_examples:
            examples, prompts = examples[: cfg.eval.max_examples], prompts[: cfg.eval.max_examples]
        e, rules = cfg.eval, rules_of(cfg.reward)
        k = e.k_by_benchmark.get(name, e.k)
        sampled = SamplingConfig(
            n=k, temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_tokens=e.max_tokens
        )
        label = f"cer eval {name}"  # the bars on stderr: samples done, a second (rank 0)
        metrics, rows = evaluate_sharded(
            engine, tokenizer, examples, prompts, sampled, rules, rank, world, f"{label} k={k}"
        )
        result = {f"avg@{k}": metrics["accuracy"], f"pass@{k}": metrics[f"pass@{k}"]}
        result[f"exact_avg@{k}"] = metrics["exact_accuracy"]
        result["boxed_rate"] = metrics["boxed_rate"]
        for extra in ("f1", "containment"):  # short-answer QA benchmarks
            if extra in metrics:
                result[f"{extra}_avg@{k}"] = metrics[extra]
        verifiers = sorted({verifier_name(ex, rules) for ex in examples})
        record: dict[str, Any] = {
            "benchmark": name,
            "file": path,
            "model": model_path,
            "verifier": "+".join(verifiers),
        }
        if e.greedy:
            greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=e.max_tokens)
            g_metrics, g_rows = evaluate_sharded(
                engine, tokenizer, examples, prompts, greedy, rules, rank, world, f"{label} greedy"
            )
            result["greedy"] = g_metrics["accuracy"]
            result["greedy_exact"] = g_metrics["exact_accuracy"]
            for extra in ("f1", "containment"):
                if extra in g_metrics:
                    result[f"greedy_{extra}"] = g_metrics[extra]
            record["greedy_rows"] = g_rows
        result["problems"] = metrics["problems"]
        results[name] = result
        record |= {"metrics": result, "sampled_rows": rows}
        if rank != 0:
            continue
        record_file = out / f"{path_name(name, 'assets.eval')}.json"
        record_file.write_text(json.dumps(record, indent=1, ensure_ascii=False))
        shown = ", ".join(
            f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
        )
        print(f"[cer eval] {name} (accuracy by {record['verifier']}): {shown}")
    if rank != 0:
        return results
    (out / "results.json").write_text(
        json.dumps({"model": model_path, "ranks": world, "results": results}, indent=1)
    )
    (out / "results.md").write_text(results_table(results, model_path))
    return results


def results_table(results: dict[str, dict[str, float]], model: str) -> str:
    """A markdown table: one row per benchmark, one column per metric."""
    columns = list(dict.fromkeys(k for r in results.values() for k in r))
    lines = [
        f"Model: `{model}`",
        "",
        "| benchmark | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, r in results.items():
        cells = [
            "" if k not in r else str(r[k]) if k == "problems" else f"{r[k]:.3f}" for k in columns
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
