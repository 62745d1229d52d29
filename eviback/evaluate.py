"""`eviback eval`: the agent on QA benchmarks, per-question results, and paired bootstrap CIs.

Per question (greedy, one rollout): EM, answer F1, valid answer, searches, duplicate queries,
forced termination. As the release: a valid answer is an answer from a well-formed trajectory (no
invalid turn), and only a valid answer scores EM and F1 (``well_formed_only``); the
duplicate-query rate is the share of questions with a repeated query. Summaries are micro over
all questions and per benchmark, plus the single-hop and multi-hop macro F1 (the mean of the
benchmarks' F1). Two runs over the same questions compare by a paired bootstrap.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common import bootstrap as common_bootstrap
from common.metrics import exact_match, f1_score
from common.rollout import AgentConfig, Trajectory
from eviback.assets import build_retriever, question_chars, select_questions, source_of
from eviback.config import EviBackConfig
from eviback.reward import rollout_facts

METRICS = (
    "f1",
    "em",
    "valid_answer_rate",
    "mean_searches",
    "duplicate_query_rate",
    "forced_termination_rate",
)
# benchmark groups of the macro F1 (the release's; 2WikiMultiHopQA under either name)
SINGLE_HOP = ("nq", "triviaqa", "popqa")
MULTI_HOP = ("hotpotqa", "2wiki", "2wikimultihopqa", "musique", "bamboogle")


@dataclass(frozen=True)
class QuestionResult:
    id: str
    benchmark: str
    em: float
    f1: float
    valid: bool
    searches: int
    duplicates: int
    forced: bool
    answer: str | None = None


def question_result(t: Trajectory, well_formed_only: bool = True) -> QuestionResult:
    """One question's row. ``valid``: an answer from a well-formed trajectory (no invalid turn,
    ended with an answer). ``well_formed_only``: EM and F1 are 0 without a valid answer."""
    facts = rollout_facts(t)
    valid = facts.well_formed and facts.answered
    scored = valid or not well_formed_only
    return QuestionResult(
        t.question_id,
        source_of(t.question_id),
        exact_match(t.answer, t.golden_answers) if scored else 0.0,
        f1_score(t.answer, t.golden_answers) if scored else 0.0,
        valid,
        t.num_searches,
        t.num_duplicate_queries,
        t.forced_terminated,
        t.answer,
    )


def summarize(results: Sequence[QuestionResult]) -> dict[str, float]:
    """Micro averages over ``results``. ``duplicate_query_rate``: share of questions with a
    repeated query (the release); ``duplicates_per_search``: Σ duplicates / Σ searches."""
    if not results:
        raise ValueError("no question results to summarise")
    n = len(results)
    searches = sum(r.searches for r in results)
    return {
        "n": n,
        "f1": sum(r.f1 for r in results) / n,
        "em": sum(r.em for r in results) / n,
        "valid_answer_rate": sum(r.valid for r in results) / n,
        "mean_searches": searches / n,
        "duplicate_query_rate": sum(r.duplicates > 0 for r in results) / n,
        "duplicates_per_search": sum(r.duplicates for r in results) / searches if searches else 0.0,
        "forced_termination_rate": sum(r.forced for r in results) / n,
    }


def summarize_by_benchmark(
    results: Sequence[QuestionResult],
    single_hop: Sequence[str] = SINGLE_HOP,
    multi_hop: Sequence[str] = MULTI_HOP,
) -> dict[str, dict[str, float]]:
    """``{"all": micro summary, benchmark: its summary, ...}``; "all" also holds
    ``single_hop_macro_f1`` and ``multi_hop_macro_f1``, the unweighted mean F1 of the benchmarks
    of each group that the results hold (absent when they hold none)."""
    names = sorted({r.benchmark for r in results})
    out = {"all": summarize(results)}
    for name in names:
        out[name] = summarize([r for r in results if r.benchmark == name])
    for key, group in (("single_hop_macro_f1", single_hop), ("multi_hop_macro_f1", multi_hop)):
        present = [name for name in names if name in group]
        if present:
            out["all"][key] = statistics.fmean(out[name]["f1"] for name in present)
    return out


def paired_bootstrap(
    a: Sequence[QuestionResult],
    b: Sequence[QuestionResult],
    metric: str = "f1",
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Δ = mean(b) − mean(a) of a per-question metric over the questions both runs have, and its
    percentile interval over ``resamples`` draws of the questions with replacement (the same
    draw for both runs; ``common.bootstrap.paired_bootstrap``). ``p_le_0``: share of draws with
    Δ* ≤ 0."""
    by_id = {r.id: r for r in a}
    shared = [r.id for r in b if r.id in by_id]
    if not shared:
        raise ValueError("the two runs have no question in common")
    if len(shared) != len(a) or len(shared) != len(b):
        raise ValueError(
            f"paired runs must cover the same questions: {len(a)} vs {len(b)}, {len(shared)} shared"
        )
    b_by_id = {r.id: r for r in b}
    diffs = [float(getattr(b_by_id[i], metric)) - float(getattr(by_id[i], metric)) for i in shared]
    out = common_bootstrap.paired_bootstrap(diffs, resamples, confidence, seed)
    return {"metric": metric, **{k: v for k, v in out.items() if k != "mde"}}


def write_results(path: Path, results: Sequence[QuestionResult]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r.__dict__, ensure_ascii=False) + "\n")


def read_results(path: str | Path) -> list[QuestionResult]:
    """Per-question rows written by ``write_results``; a bad row names the file and line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(QuestionResult(**json.loads(line)))
            except (json.JSONDecodeError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a per-question result ({e})") from None
    return out


def markdown_table(summary: dict[str, dict[str, float]], comparisons: Sequence[dict] = ()) -> str:
    header = "| benchmark | n | F1 | EM | valid | searches | dup. queries | forced |"
    lines = [header, "|" + "---|" * 8]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['n']:.0f} | {s['f1']:.4f} | {s['em']:.4f} | "
            f"{s['valid_answer_rate']:.4f} | {s['mean_searches']:.2f} | "
            f"{s['duplicate_query_rate']:.4f} | {s['forced_termination_rate']:.4f} |"
        )
    macro = [
        f"{label} macro F1: {summary['all'][key]:.4f}"
        for key, label in (
            ("single_hop_macro_f1", "single-hop"),
            ("multi_hop_macro_f1", "multi-hop"),
        )
        if key in summary.get("all", {})
    ]
    if macro:
        lines += ["", "; ".join(macro) + " (mean of the benchmarks' F1)"]
    if comparisons:
        lines += ["", "| metric | n | Δ (this − other) | CI | P(Δ* ≤ 0) |", "|---|---|---|---|---|"]
        for c in comparisons:
            lines.append(
                f"| {c['metric']} | {c['n']} | {c['delta']:+.4f} | "
                f"[{c['ci_low']:+.4f}, {c['ci_high']:+.4f}] ({c['confidence']:.0%}) | "
                f"{c['p_le_0']:.4f} |"
            )
    return "\n".join(lines) + "\n"


def compare(
    this: Sequence[QuestionResult], other: Sequence[QuestionResult], resamples: int, conf: float
) -> list[dict]:
    """Paired bootstrap of F1 and EM: this run minus the other."""
    return [paired_bootstrap(other, this, m, resamples, conf) for m in ("f1", "em")]


def gather_shards(results: list[QuestionResult], world: int) -> list[QuestionResult]:
    """Every rank's results of ``examples[rank::world]``, back in the order of ``examples``."""
    if world == 1:
        return results
    import torch.distributed as dist

    shards: list[list[QuestionResult] | None] = [None] * world
    dist.all_gather_object(shards, results)
    total = sum(len(s) for s in shards)
    return [shards[i % world][i // world] for i in range(total)]


def run_eval(cfg: EviBackConfig) -> dict:
    """Evaluate the model on ``assets.eval`` (quotas applied); write run_dir/eval/.

    Under the DeepSpeed launcher (or torchrun) each rank runs its own engine on every
    world-th question and rank 0 writes the gathered results; the others return a short note.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.rl_loop import agent_rollouts, build_engine
    from common.train import find_latest_checkpoint
    from common.train.distributed import init_distributed

    latest = find_latest_checkpoint(cfg.run_dir)
    model_path = cfg.eval.model or (str(latest) if latest else cfg.assets.model)
    cfg.assets.model = model_path
    cfg.check_assets(("model", "eval", "retrieval"))
    if cfg.eval.compare_to and not Path(cfg.eval.compare_to).is_file():
        raise FileNotFoundError(f"eval.compare_to: {cfg.eval.compare_to} not found")
    examples = select_questions(cfg.assets, "eval", cfg.seed, question_chars(cfg.agent, cfg.engine))
    rank, world, _ = init_distributed()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = None
    if cfg.engine.backend == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    engine = build_engine(cfg.engine, model_path, model, tokenizer, cfg.seed)
    turns = cfg.eval.max_turns or cfg.agent.max_turns
    greedy = AgentConfig(
        **{**vars(cfg.agent), "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_turns": turns}
    )
    retriever = build_retriever(cfg.assets)
    mine = examples[rank::world]  # rank 0's bar counts its share (stderr: count and rate)
    trajs = agent_rollouts(
        engine, tokenizer, retriever, mine, 1, greedy, "eviback eval", group_prefix="eval:"
    )
    results = gather_shards([question_result(t, cfg.em_well_formed) for t in trajs], world)
    if rank != 0:
        return {"model": model_path, "rank": rank, "questions": len(trajs)}
    out = Path(cfg.run_dir) / "eval"
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / "per_question.jsonl", results)
    summary = summarize_by_benchmark(results)
    comparisons = []
    if cfg.eval.compare_to:
        other = read_results(cfg.eval.compare_to)
        comparisons = compare(results, other, cfg.eval.bootstrap_resamples, cfg.eval.confidence)
    report = {"model": model_path, "summary": summary, "comparisons": comparisons}
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    (out / "table.md").write_text(markdown_table(summary, comparisons))
    return report
