"""`eviback ape`: the E2E-APE command loop over the pure parts in ``eviback.ape``.

1. actor rollouts on training questions -> benchmark rows labelled by the evidence oracle where
   the question has supporting facts, else by the controller LLM (``ape.unlabelled=llm``) or
   left out, counted -> dev / holdout split by question, stratified by search step
   (``benchmark.jsonl`` is reused when present);
2. stage-A and stage-B candidates: proposed by the controller LLM when one is configured, else a
   seeded sample of the grid;
3. every single-stage candidate, then gated pairs of the best stage-A prompts with every stage-B
   candidate, run ``ape.repeats`` times with the teacher on dev;
4. selection on dev, one evaluation of the two selected policies on holdout, the frozen policy
   file (``policy.yaml``) and ``report.md`` (with the selected policy's confusion matrix, gold
   coverage and missed-I rows on holdout).

The teacher is always a model behind ``assets.teacher_endpoint``: judging prompts needs one.
The command is one process: under a launcher's several ranks it refuses before it loads anything
(``check_one_process``).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from common.data import QAExample
from common.llm_client import LLMClient
from common.train.distributed import refuse_ranks
from eviback.ape import (
    BenchmarkRow,
    CandidateResult,
    candidate_grid,
    candidate_result,
    diagnostics,
    gated_policies,
    label_rollouts,
    labeller_messages,
    read_benchmark,
    results_table,
    select_best,
    split_by_question,
    split_by_step,
    write_benchmark,
    write_policy_file,
)
from eviback.assets import build_retriever, llm_client, question_chars, select_questions
from eviback.config import EviBackConfig
from eviback.oracle import EvidenceOracle
from eviback.prompts import (
    INSTRUCTIONS,
    WRITTEN_PREFIX,
    TeacherPrompt,
    get_prompt,
    register_instruction,
)
from eviback.teacher import (
    TeacherItem,
    TeacherPolicy,
    TeacherStats,
    TwoStageTeacher,
    Verdict,
    parse_verdict,
)

_PROMPT_ID = re.compile(r"\b[AB]-[a-z_]+-[a-z_]+-fs[01]-q[01]-t[01]-[a-z]+-m\d+\b")


def rollout_benchmark(
    cfg: EviBackConfig, labeller: LLMClient | None = None
) -> tuple[list[BenchmarkRow], dict[str, int]]:
    """Actor rollouts (sampled, ``ape.rollouts`` per question) labelled by the evidence oracle
    where the question has supporting facts, else by ``labeller`` (``ape.unlabelled=llm``) or
    left out; returns the rows and the counts (``label_rollouts``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.rl_loop import build_engine
    from common.rollout import run_agent

    a = cfg.assets
    examples = ape_questions(cfg)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = None
    if cfg.engine.backend == "hf":
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    engine = build_engine(cfg.engine, a.model, model, tokenizer, cfg.seed)
    trajs = run_agent(
        engine, tokenizer, build_retriever(a), examples, cfg.ape.rollouts, cfg.agent, "ape:"
    )
    oracle = EvidenceOracle(cfg.teacher.top_m)
    llm = None if labeller is None else llm_labeller(labeller, cfg.teacher.top_m)
    return label_rollouts(trajs, {ex.id: ex for ex in examples}, oracle.label, llm)


def ape_questions(cfg: EviBackConfig) -> list[QAExample]:
    """``ape.questions`` training questions, a seeded draw from the training set (quotas applied,
    ``select_questions``), so that every source is represented (the first rows of the files
    would all be NQ's at paper scale, which has no supporting facts)."""
    train = select_questions(cfg.assets, "train", cfg.seed, question_chars(cfg))
    return random.Random(f"ape:{cfg.seed}").sample(train, min(cfg.ape.questions, len(train)))


def llm_labeller(client: LLMClient, top_m: int = 5):
    """Labels benchmark items with the controller LLM (``labeller_messages``), in one batch; a
    reply that breaks the contract is an invalid verdict."""

    def label(items: list[TeacherItem]) -> list[Verdict]:
        replies = client.chat_many([labeller_messages(item, top_m) for item in items])
        return [parse_verdict(r.text) for r in replies]

    return label


def label_counts_text(counts: dict[str, int]) -> str:
    """One line on how the benchmark was labelled (empty counts: a benchmark file given as is)."""
    if not counts:
        return "a given benchmark file (no labelling counts)."
    return (
        f"{counts['rows_oracle']} rows of {counts['questions_oracle']} questions by the evidence "
        f"oracle; {counts['questions_without_facts']} questions without supporting facts: "
        f"{counts['rows_llm']} rows labelled by the controller LLM ({counts['rows_llm_invalid']} "
        f"replies broke the contract, left out), {counts['questions_left_out']} questions left out."
    )


def controller_candidates(
    client: LLMClient, stage: str, k: int, seed: int = 0
) -> tuple[list[TeacherPrompt], int]:
    """Ask the controller for ``k`` prompt ids on the axes; returns the candidates and how many
    came from the controller. The default prompt is always first; names that do not parse, are
    of the other stage or repeat are dropped, and places left over are filled from the seeded
    grid (counted, and said in the report)."""
    default = candidate_grid(stage, limit=1)[0]
    instructions = ", ".join(sorted(INSTRUCTIONS[stage]))
    ask = (
        f"We tune the stage-{stage} prompt of an evidence judge. A prompt is named "
        f"{default.id!r}: stage-instruction-answer_rule-fs(few-shot 0/1)-q(sub-queries shown "
        f"0/1{', always 0 for stage B' if stage == 'B' else ''})-t(titles shown 0/1)-"
        f"order(rank|reverse)-m(documents per round). Instructions: {instructions}. "
        f"Propose {k} promising distinct names, one per line, nothing else."
    )
    result = client.chat([{"role": "user", "content": ask}], cache_tag=f"ape-controller-{stage}")
    proposed = parse_controller_reply(result.text or "", stage)
    found = [default] + [p for p in proposed if p != default]
    found = found[:k]
    from_controller = len(found) - 1
    grid = candidate_grid(stage)
    for p in candidate_grid(stage, limit=len(grid), seed=seed):  # the grid in a seeded order
        if len(found) >= k:
            break
        if p not in found:
            found.append(p)
    return found, from_controller


_WRITTEN = re.compile(r"<instruction>(.*?)</instruction>", re.S)


def controller_written(client: LLMClient, stage: str, k: int) -> list[TeacherPrompt]:
    """Ask the controller to write ``k`` new instruction texts for ``stage`` (each between
    ``<instruction>`` and ``</instruction>``); each becomes a registered instruction in the
    default prompt's layout. Empty, repeated or over-long (> 2,000 characters) texts are
    dropped."""
    if k <= 0:
        return []
    default = candidate_grid(stage, limit=1)[0]
    current = INSTRUCTIONS[stage][default.instruction]
    role = "without the reference answer" if stage == "A" else "given a candidate answer"
    ask = (
        f"We tune the instruction of an evidence judge (stage {stage}: it judges, {role}, "
        "whether the documents a search agent retrieved support one complete answer, miss a "
        "needed fact, or support several incompatible answers). The current instruction is:\n"
        f"{current}\n\nWrite {k} alternative instructions with the same task and output "
        "contract, each between <instruction> and </instruction>, nothing else."
    )
    reply = client.chat([{"role": "user", "content": ask}], cache_tag=f"ape-writer-{stage}")
    found: list[TeacherPrompt] = []
    for text in _WRITTEN.findall(reply.text or ""):
        if not text.strip() or len(text) > 2000:
            continue
        prompt = replace(default, instruction=register_instruction(stage, text))
        if prompt not in found and prompt != default:
            found.append(prompt)
    return found[:k]


def parse_controller_reply(text: str, stage: str) -> list[TeacherPrompt]:
    """The distinct valid prompt ids of ``stage`` named in a controller's reply, in order."""
    found: list[TeacherPrompt] = []
    for name in _PROMPT_ID.findall(text):
        try:
            p = get_prompt(name)
        except ValueError:
            continue
        if p.stage == stage and p not in found:
            found.append(p)
    return found


def evaluate_policy(
    client: LLMClient, policy: TeacherPolicy, rows: Sequence[BenchmarkRow], repeats: int,
    weights: tuple[float, float], tag: str,
) -> CandidateResult:  # fmt: skip
    """``repeats`` runs of the policy on ``rows`` (each run its own cache tag, so a repeat is a
    fresh request) -> metrics, agreement and cost."""
    return candidate_result(policy, rows, *policy_runs(client, policy, rows, repeats, tag), weights)


def policy_runs(
    client: LLMClient, policy: TeacherPolicy, rows: Sequence[BenchmarkRow], repeats: int, tag: str
) -> tuple[list[list[Verdict]], list[TeacherStats]]:
    """The final verdicts (row order) and the teacher's counts of each of ``repeats`` runs."""
    runs: list[list[Verdict]] = []
    costs: list[TeacherStats] = []
    items = [r.item() for r in rows]
    for k in range(repeats):
        backend = lambda batch, k=k: [  # noqa: E731
            (r.text, r.__dict__) for r in client.chat_many(batch, cache_tag=f"{tag}:{k}")
        ]
        judgements, stats = TwoStageTeacher(backend, policy).judge(items)
        runs.append([j.final for j in judgements])
        costs.append(stats)
    return runs, costs


def check_one_process() -> None:
    """Refuse a launcher's start of several ranks (``WORLD_SIZE`` > 1)."""
    refuse_ranks(
        "eviback ape",
        "E2E-APE's rollouts, controller and teacher calls are not split over ranks",
    )


def run_ape(cfg: EviBackConfig) -> dict:
    """The whole pipeline; returns the selection and the paths written."""
    check_one_process()
    cfg.teacher.backend = "llm"
    if not (cfg.assets.teacher_endpoint and cfg.assets.teacher_model):
        raise ValueError(
            "`eviback ape` judges prompts with a teacher model: set assets.teacher_endpoint and "
            "assets.teacher_model (any OpenAI-compatible server, e.g. vLLM's)"
        )
    out = Path(cfg.ape.out or Path(cfg.run_dir) / "ape")
    out.mkdir(parents=True, exist_ok=True)
    bench, counts_file = out / "benchmark.jsonl", out / "benchmark_counts.json"
    a = cfg.assets
    if cfg.ape.unlabelled == "llm" and not (a.controller_endpoint and a.controller_model):
        raise ValueError(
            "ape.unlabelled=llm labels questions without supporting facts with the controller "
            "LLM: set assets.controller_endpoint and assets.controller_model"
        )
    if bench.is_file():
        rows = read_benchmark(bench)
        counts = json.loads(counts_file.read_text()) if counts_file.is_file() else {}
    else:
        cfg.check_assets(("model", "train", "retrieval"))
        labeller = None
        if cfg.ape.unlabelled == "llm":
            labeller = llm_client(
                a.controller_endpoint, a.controller_model, cfg.teacher, out / "cache", a.api_key_env
            )
            labeller.probe()  # before the policy model loads for the rollouts
        rows, counts = rollout_benchmark(cfg, labeller)
        counts_file.write_text(json.dumps(counts, indent=2))
        write_benchmark(bench, rows)  # last: its presence says the benchmark is complete
    split = split_by_step if cfg.ape.split == "step" else split_by_question
    dev, holdout = split(rows, cfg.ape.holdout_fraction, cfg.seed)
    teacher = llm_client(
        a.teacher_endpoint, a.teacher_model, cfg.teacher, out / "cache", a.api_key_env
    )
    teacher.probe()
    if a.controller_endpoint:
        controller = llm_client(
            a.controller_endpoint, a.controller_model, cfg.teacher, out / "cache", a.api_key_env
        )
        controller.probe()
        prompts_a, n_a = controller_candidates(controller, "A", cfg.ape.candidates_a, cfg.seed)
        prompts_b, n_b = controller_candidates(controller, "B", cfg.ape.candidates_b, cfg.seed)
        written_a = controller_written(controller, "A", cfg.ape.written_a)
        written_b = controller_written(controller, "B", cfg.ape.written_b)
        prompts_a, prompts_b = prompts_a + written_a, prompts_b + written_b
        source = (
            f"candidates from the controller {a.controller_model} (stage A: {n_a} proposed + "
            f"the default + {len(prompts_a) - n_a - 1 - len(written_a)} from the grid + "
            f"{len(written_a)} written by the controller; stage B: {n_b} + 1 + "
            f"{len(prompts_b) - n_b - 1 - len(written_b)} + {len(written_b)} written)"
        )
    else:
        prompts_a = candidate_grid("A", limit=cfg.ape.candidates_a, seed=cfg.seed)
        prompts_b = candidate_grid("B", limit=cfg.ape.candidates_b, seed=cfg.seed)
        source = "candidates from the grid"
    w, reps = cfg.ape.objective_weights, cfg.ape.repeats
    single = [evaluate_policy(teacher, TeacherPolicy(p.id), dev, reps, w, "dev") for p in prompts_a]
    top_a = sorted(single, key=lambda r: -r.summary()["objective_mean"])[: cfg.ape.gated_from_top]
    gated = [
        evaluate_policy(teacher, policy, dev, reps, w, "dev")
        for policy in gated_policies([r.policy.stage_a for r in top_a], [p.id for p in prompts_b])
    ]
    selection = select_best(single + gated)
    chosen = [r for r in (selection.single, selection.gated) if r is not None]
    held_runs = [policy_runs(teacher, r.policy, holdout, 1, "holdout") for r in chosen]
    held = [
        candidate_result(r.policy, holdout, *runs, w)
        for r, runs in zip(chosen, held_runs, strict=True)
    ]
    best_at = next(i for i, h in enumerate(held) if h.policy == selection.best.policy)
    best_holdout = held[best_at]
    scores = {
        "dev": selection.best.summary(),
        "holdout": best_holdout.summary(),
        "dev_rows": len(dev),
        "holdout_rows": len(holdout),
    }
    write_policy_file(out / "policy.yaml", selection.best.policy, scores)
    labels = {s: sum(r.label == s for r in rows) for s in ("S", "I", "A")}
    report = "\n".join(
        [
            "# E2E-APE report",
            "",
            f"Benchmark: {len(rows)} rows ({labels}), dev {len(dev)}, holdout {len(holdout)}; "
            f"{source}; "
            f"{reps} runs per candidate; teacher {a.teacher_model}; holdout split: "
            f"{cfg.ape.split}.",
            "",
            f"Labels: {label_counts_text(counts)}",
            "",
            f"Selected: `{selection.best.policy.strategy_id}` (frozen in `policy.yaml`).",
            "",
            "## Dev",
            "",
            results_table(single + gated),
            "## Holdout (selected single-stage and gated, evaluated once)",
            "",
            results_table(held),
            f"## Holdout rows, selected policy `{selection.best.policy.strategy_id}`",
            "",
            diagnostics(holdout, held_runs[best_at][0][0]),
        ]
    )
    written = [
        f"- `{p.instruction}` (stage {p.stage}): {INSTRUCTIONS[p.stage][p.instruction]}"
        for p in {*prompts_a, *prompts_b}
        if p.instruction.startswith(WRITTEN_PREFIX)
    ]
    if written:
        report += "\n## Instructions written by the controller\n\n" + "\n".join(sorted(written))
        report += "\n"
    (out / "report.md").write_text(report, encoding="utf-8")
    return {"selection": selection, "policy_file": str(out / "policy.yaml"), "out": str(out)}
