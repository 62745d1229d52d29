"""E2E-APE, the pure parts: benchmark, split, candidate grid, metrics, selection, frozen policy.

1. Benchmark: each rollout is cut after each of its search rounds; every distinct (question,
   evidence so far) is a row labelled S / I / A by a labeller (the evidence oracle where the data
   has supporting documents). Rows are split into dev / holdout by question.
2. Candidates: prompts on a grid over the axes of ``PromptAxes``; gated two-stage policies pair
   Stage-A and Stage-B prompts with gating flags.
3. Metrics of a candidate on rows: I precision / recall / F1, the S/I/A confusion, gold-F1
   coverage on gold-S rows, parse rate; over repeated runs the mean / min / max and the status
   agreement; cost from the teacher's counts. Objective ``w_I·I_F1 + w_cov·coverage``.
4. Selection of the best single-stage and the best gated policy; the frozen policy file.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from common.api_budget import RequestGroup
from common.data import QAExample
from common.jsonl import write_jsonl_atomic
from common.metrics import f1_score
from common.retrieval.base import Doc
from eviback.prompts import (
    ANSWER_RULES,
    DOC_ORDERS,
    INSTRUCTIONS,
    STAGE_A_DEFAULT,
    STAGE_B_DEFAULT,
    WRITTEN_PREFIX,
    Round,
    TeacherPrompt,
    get_prompt,
    register_instruction,
    render_evidence,
    rounds_from_trajectory,
)
from eviback.teacher import TeacherItem, TeacherPolicy, TeacherStats, Verdict

if TYPE_CHECKING:
    from common.rollout.trajectory import Trajectory

PREDICTED = ("S", "I", "A", "invalid")

# --- 1. benchmark ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchmarkRow:
    row_id: str
    question_id: str
    question: str
    golden_answers: tuple[str, ...]
    rounds: tuple[Round, ...]
    label: str  # S | I | A, from the evidence only
    label_answer: str = ""

    def item(self) -> TeacherItem:
        return TeacherItem(self.question, self.rounds, self.golden_answers)


def build_benchmark(
    trajectories: Sequence[Trajectory],
    examples: Mapping[str, QAExample],
    labeller: Callable[[TeacherItem], Verdict],
) -> list[BenchmarkRow]:
    """One row per distinct (question, first k search rounds) over the rollouts, k ≥ 1."""
    rows: list[BenchmarkRow] = []
    seen: set = set()
    for t in trajectories:
        example = examples.get(t.question_id)
        if example is None:
            raise ValueError(
                f"rollout {t.group_id}/{t.sample_index}: unknown question {t.question_id!r}"
            )
        rounds = [Round(q, tuple(docs)) for q, docs in rounds_from_trajectory(t)]
        for k in range(1, len(rounds) + 1):
            prefix = tuple(rounds[:k])
            key = (
                t.question_id,
                tuple((q, tuple((d.id, len(d.text)) for d in docs)) for q, docs in prefix),
            )
            if key in seen:
                continue
            seen.add(key)
            item = TeacherItem(example.question, prefix, example.golden_answers, example.metadata)
            verdict = labeller(item)
            if not verdict.valid:
                raise ValueError(
                    f"rollout {t.group_id}/{t.sample_index}, round {k}: the labeller gave an "
                    f"invalid verdict ({verdict.error})"
                )
            rows.append(
                BenchmarkRow(
                    f"{t.question_id}/{t.sample_index}/{k}",
                    t.question_id,
                    example.question,
                    tuple(example.golden_answers),
                    prefix,
                    verdict.status,
                    verdict.answer,
                )
            )
    return rows


def has_supporting_facts(example: QAExample) -> bool:
    """Whether the evidence oracle can label this question (supporting ids or titles known)."""
    return bool(example.metadata.get("supporting_ids") or example.metadata.get("supporting_titles"))


LABELLER_INSTRUCTION = (
    "You label evidence for a benchmark of search-agent evidence. Read the question and the "
    "documents a search agent retrieved. Decide from the documents alone whether they support "
    "one complete answer to the question (supported_answer), miss a fact or a bridge the answer "
    "needs (insufficient_evidence), or support several incompatible complete answers "
    "(ambiguous_evidence). The reference answers say what a correct answer looks like; they are "
    "not evidence: if the documents do not state it, the evidence is insufficient. Reply with "
    "exactly <reason>one sentence</reason><status>supported_answer|insufficient_evidence|"
    "ambiguous_evidence</status><answer>the supported answer, empty otherwise</answer> and "
    "nothing else.\n\nQuestion: {question}\nReference answers: {references}\n\n"
    "Documents:\n{evidence}"
)


def labeller_messages(item: TeacherItem, top_m: int = 5) -> list[dict[str, str]]:
    """The controller LLM's labelling request for one benchmark item (questions without
    supporting facts, e.g. NQ)."""
    evidence = render_evidence(item.rounds, show_queries=True, top_m=top_m)
    text = LABELLER_INSTRUCTION.format(
        question=item.question.strip(), references=" | ".join(item.references), evidence=evidence
    )
    return [{"role": "user", "content": text}]


def label_rollouts(
    trajectories: Sequence[Trajectory],
    examples: Mapping[str, QAExample],
    oracle: Callable[[TeacherItem], Verdict],
    llm: Callable[[list[TeacherItem]], list[Verdict]] | None = None,
) -> tuple[list[BenchmarkRow], dict[str, int]]:
    """Benchmark rows: the oracle labels the questions with supporting facts; the others are
    labelled by ``llm`` (one batch; a row whose verdict is invalid is dropped, counted) or, with
    no ``llm``, left out, counted. Returns the rows and the counts."""
    for t in trajectories:
        if t.question_id not in examples:
            raise ValueError(
                f"rollout {t.group_id}/{t.sample_index}: unknown question {t.question_id!r}"
            )
    with_facts = [t for t in trajectories if has_supporting_facts(examples[t.question_id])]
    without = [t for t in trajectories if not has_supporting_facts(examples[t.question_id])]
    rows = build_benchmark(with_facts, examples, oracle)
    counts = {
        "questions_oracle": len({t.question_id for t in with_facts}),
        "questions_without_facts": len({t.question_id for t in without}),
        "rows_oracle": len(rows),
        "rows_llm": 0,
        "rows_llm_invalid": 0,
        "questions_left_out": 0,
    }
    if not without:
        return rows, counts
    if llm is None:
        counts["questions_left_out"] = counts["questions_without_facts"]
        return rows, counts
    pending: list[TeacherItem] = []

    def collect(item: TeacherItem) -> Verdict:
        pending.append(item)
        return Verdict(True, "I", "", "to be labelled")

    unlabelled = build_benchmark(without, examples, collect)
    verdicts = llm(pending)
    if len(verdicts) != len(unlabelled):
        raise ValueError(f"the LLM labeller gave {len(verdicts)} verdicts for {len(pending)} rows")
    for row, v in zip(unlabelled, verdicts, strict=True):
        if not v.valid:
            counts["rows_llm_invalid"] += 1
            continue
        rows.append(replace(row, label=v.status, label_answer=v.answer))
        counts["rows_llm"] += 1
    return rows, counts


def write_benchmark(path: str | Path, rows: Sequence[BenchmarkRow]) -> None:
    """``rows`` as JSON lines, written beside ``path`` and renamed into place: a run killed while
    writing leaves no partial benchmark for the next one to reuse."""
    write_jsonl_atomic(Path(path), [_benchmark_record(row) for row in rows])


def _benchmark_record(row: BenchmarkRow) -> dict:
    """A benchmark row as its JSON line's object (each round's documents as dicts)."""
    d = asdict(row)
    d["rounds"] = [{"query": q, "docs": [doc._asdict() for doc in docs]} for q, docs in row.rounds]
    return d


def read_benchmark(path: str | Path) -> list[BenchmarkRow]:
    """Rows written by ``write_benchmark``; a bad row is an error naming the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                d = json.loads(line)
                rounds = tuple(
                    Round(r["query"], tuple(Doc(**doc) for doc in r["docs"])) for r in d["rounds"]
                )
                row = BenchmarkRow(
                    d["row_id"],
                    d["question_id"],
                    d["question"],
                    tuple(d["golden_answers"]),
                    rounds,
                    d["label"],
                    d.get("label_answer", ""),
                )
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
            except KeyError as e:
                raise ValueError(f"{where}: missing field {e.args[0]!r}") from None
            except TypeError as e:
                raise ValueError(f"{where}: malformed row ({e})") from None
            if row.label not in ("S", "I", "A"):
                raise ValueError(f"{where}: field 'label' must be S, I or A, got {row.label!r}")
            rows.append(row)
    return rows


def split_by_question(
    rows: Sequence[BenchmarkRow], holdout_fraction: float = 0.3, seed: int = 0
) -> tuple[list[BenchmarkRow], list[BenchmarkRow]]:
    """(dev, holdout): a seeded shuffle of the question ids; no question lands in both."""
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must lie in (0, 1), got {holdout_fraction}")
    questions = sorted({r.question_id for r in rows})
    if len(questions) < 2:
        raise ValueError(f"a dev/holdout split needs at least 2 questions, got {len(questions)}")
    random.Random(seed).shuffle(questions)
    n_holdout = min(len(questions) - 1, max(1, round(holdout_fraction * len(questions))))
    holdout = set(questions[:n_holdout])
    return (
        [r for r in rows if r.question_id not in holdout],
        [r for r in rows if r.question_id in holdout],
    )


def split_by_step(
    rows: Sequence[BenchmarkRow], holdout_fraction: float = 0.3, seed: int = 0
) -> tuple[list[BenchmarkRow], list[BenchmarkRow]]:
    """(dev, holdout) stratified by search step (the release: a holdout quota per step layer,
    split over the labels by largest remainder), with no question in both.

    A row's layer is its number of search rounds. Layer by layer (fewest rounds first), the
    holdout quota is ``round(holdout_fraction · rows in the layer)`` and each label's share of it
    is given by largest remainder; questions are taken in a seeded order for a label still
    short, and a taken question brings all its rows (which count wherever they fall).
    """
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must lie in (0, 1), got {holdout_fraction}")
    questions = sorted({r.question_id for r in rows})
    if len(questions) < 2:
        raise ValueError(f"a dev/holdout split needs at least 2 questions, got {len(questions)}")
    rank = {q: i for i, q in enumerate(random.Random(seed).sample(questions, len(questions)))}
    by_question: dict[str, list[BenchmarkRow]] = {}
    for r in rows:
        by_question.setdefault(r.question_id, []).append(r)
    holdout: set[str] = set()
    for layer in sorted({len(r.rounds) for r in rows}):
        in_layer = [r for r in rows if len(r.rounds) == layer]
        counts = {label: sum(r.label == label for r in in_layer) for label in ("S", "I", "A")}
        quota = largest_remainder(counts, round(holdout_fraction * len(in_layer)))
        for label in ("S", "I", "A"):
            for r in sorted(in_layer, key=lambda r: (rank[r.question_id], r.row_id)):
                taken = sum(x.label == label and x.question_id in holdout for x in in_layer)
                if taken >= quota[label]:
                    break
                if r.label == label and r.question_id not in holdout:
                    if len(holdout) + 1 >= len(questions):
                        break  # dev keeps at least one question
                    holdout.add(r.question_id)
    return (
        [r for r in rows if r.question_id not in holdout],
        [r for r in rows if r.question_id in holdout],
    )


def largest_remainder(counts: Mapping[str, int], total: int) -> dict[str, int]:
    """``total`` split in proportion to ``counts`` by largest remainder (ties: the order of
    ``counts``)."""
    n = sum(counts.values())
    if n == 0 or total <= 0:
        return dict.fromkeys(counts, 0)
    exact = {k: total * c / n for k, c in counts.items()}
    out = {k: int(v) for k, v in exact.items()}
    order = sorted(counts, key=lambda k: -(exact[k] - out[k]))
    for k in order[: total - sum(out.values())]:
        out[k] += 1
    return out


def diagnostics(rows: Sequence[BenchmarkRow], verdicts: Sequence[Verdict]) -> str:
    """The report's per-row view of one policy's run: the S/I/A confusion matrix, the gold-S
    rows with the teacher's answer and its F1 (gold coverage), the missed I (gold I judged S, A
    or invalid) and the false I (gold S or A judged I)."""
    m = judge_metrics(rows, verdicts)
    lines = ["| gold \\ teacher | " + " | ".join(PREDICTED) + " |", "|" + "---|" * 5]
    for gold in ("S", "I", "A"):
        lines.append(
            f"| {gold} | " + " | ".join(str(m.confusion[gold][p]) for p in PREDICTED) + " |"
        )
    shown = lambda v: v.status if v.valid else "invalid"  # noqa: E731
    cover = [
        f"- `{r.row_id}` gold {list(r.golden_answers)}: teacher {shown(v)} "
        f"{v.answer!r} (F1 {f1_score(v.answer, r.golden_answers) if shown(v) == 'S' else 0.0:.2f})"
        for r, v in zip(rows, verdicts, strict=True)
        if r.label == "S"
    ]
    missed = [
        f"- `{r.row_id}` ({r.question[:80]}): teacher {shown(v)} {v.answer!r}"
        for r, v in zip(rows, verdicts, strict=True)
        if r.label == "I" and shown(v) != "I"
    ]
    false_i = [
        f"- `{r.row_id}` gold {r.label} ({r.question[:80]})"
        for r, v in zip(rows, verdicts, strict=True)
        if r.label != "I" and shown(v) == "I"
    ]
    sections = [
        ("Confusion (rows: gold label, columns: the teacher's final verdict)", lines),
        (f"Gold coverage on gold-S rows: {m.gold_f1_coverage:.4f}", cover or ["- none"]),
        (f"Missed I ({len(missed)})", missed or ["- none"]),
        (f"False I ({len(false_i)})", false_i or ["- none"]),
    ]
    return "\n\n".join(f"{head}\n\n" + "\n".join(body) for head, body in sections) + "\n"


# --- 2. candidates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptAxes:
    """The values each axis takes in the grid (stage B always hides the sub-queries)."""

    instructions_a: tuple[str, ...] = tuple(INSTRUCTIONS["A"])
    instructions_b: tuple[str, ...] = tuple(INSTRUCTIONS["B"])
    answer_rules: tuple[str, ...] = tuple(ANSWER_RULES)
    few_shot: tuple[bool, ...] = (False, True)
    show_queries: tuple[bool, ...] = (True, False)
    show_titles: tuple[bool, ...] = (True, False)
    doc_order: tuple[str, ...] = DOC_ORDERS
    top_m: tuple[int, ...] = (5,)


def candidate_grid(
    stage: str, axes: PromptAxes = PromptAxes(), limit: int | None = None, seed: int = 0
) -> list[TeacherPrompt]:
    """The stage's prompts over the axes, the hand-written default first; ``limit`` keeps the
    default and a seeded sample of the rest."""
    instructions = {"A": axes.instructions_a, "B": axes.instructions_b}[stage]
    show_queries = axes.show_queries if stage == "A" else (False,)
    grid = [
        TeacherPrompt(stage, *options)
        for options in itertools.product(
            instructions,
            axes.answer_rules,
            axes.few_shot,
            show_queries,
            axes.show_titles,
            axes.doc_order,
            axes.top_m,
        )
    ]
    default = STAGE_A_DEFAULT if stage == "A" else STAGE_B_DEFAULT
    rest = [p for p in grid if p != default]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        rest = random.Random(seed).sample(rest, min(limit - 1, len(rest)))
    return [default, *rest]


def gated_policies(
    stage_a: Sequence[str],
    stage_b: Sequence[str],
    gates: Sequence[tuple[str, ...]] = (("S", "A"), ("S",)),
    canonicalize: Sequence[bool] = (True, False),
) -> list[TeacherPolicy]:
    """Every gated two-stage combination of the given prompt ids and gating flags."""
    return [
        TeacherPolicy(a, b, gate, canon)
        for a, b, gate, canon in itertools.product(stage_a, stage_b, gates, canonicalize)
    ]


# --- 3. metrics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeMetrics:
    """One run of a candidate over benchmark rows. Ratios with an empty denominator are 0."""

    n: int
    parse_rate: float
    i_precision: float
    i_recall: float
    i_f1: float
    gold_f1_coverage: float  # mean F1(answer, gold) over gold-S rows; 0 for non-S verdicts
    objective: float
    confusion: dict[str, dict[str, int]]  # gold label -> predicted S / I / A / invalid -> count


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def judge_metrics(
    rows: Sequence[BenchmarkRow],
    verdicts: Sequence[Verdict],
    weights: tuple[float, float] = (0.5, 0.5),
) -> JudgeMetrics:
    """P_I = |pred I ∧ gold I| / |pred I|, R_I = |pred I ∧ gold I| / |gold I|, F1_I = 2PR/(P+R);
    coverage = mean over gold-S rows of F1(answer, gold answers), counting only valid S verdicts;
    objective = w_I·F1_I + w_cov·coverage."""
    if len(rows) != len(verdicts):
        raise ValueError(f"{len(verdicts)} verdicts for {len(rows)} benchmark rows")
    confusion = {gold: dict.fromkeys(PREDICTED, 0) for gold in ("S", "I", "A")}
    coverage = []
    for row, v in zip(rows, verdicts, strict=True):
        confusion[row.label][v.status if v.valid else "invalid"] += 1
        if row.label == "S":
            supported = v.valid and v.status == "S"
            coverage.append(f1_score(v.answer, row.golden_answers) if supported else 0.0)
    true_i = confusion["I"]["I"]
    precision = _ratio(true_i, sum(confusion[g]["I"] for g in confusion))
    recall = _ratio(true_i, sum(confusion["I"].values()))
    f1 = _ratio(2 * precision * recall, precision + recall)
    cov = statistics.fmean(coverage) if coverage else 0.0
    return JudgeMetrics(
        n=len(rows),
        parse_rate=_ratio(sum(v.valid for v in verdicts), len(verdicts)),
        i_precision=precision,
        i_recall=recall,
        i_f1=f1,
        gold_f1_coverage=cov,
        objective=weights[0] * f1 + weights[1] * cov,
        confusion=confusion,
    )


def status_agreement(runs: Sequence[Sequence[Verdict]]) -> float:
    """Share of rows whose status (invalid counted as one) is the same in every run."""
    if not runs or any(len(r) != len(runs[0]) for r in runs):
        raise ValueError("status agreement needs one or more runs over the same rows")
    same = sum(
        len({v.status if v.valid else None for v in column}) == 1
        for column in zip(*runs, strict=True)
    )
    return _ratio(same, len(runs[0]))


@dataclass(frozen=True)
class CandidateResult:
    """A candidate policy's runs on a set of rows, with the teacher's counts per run."""

    policy: TeacherPolicy
    runs: tuple[JudgeMetrics, ...]
    costs: tuple[TeacherStats, ...]
    agreement: float

    def summary(self) -> dict[str, Any]:
        """Mean / min / max of the objective; means over runs of the rest (cost per run)."""
        objectives = [m.objective for m in self.runs]

        def mean(get: Callable[[Any], float], xs: Sequence) -> float:
            return statistics.fmean(get(x) for x in xs)

        return {
            "strategy_id": self.policy.strategy_id,
            "objective_mean": statistics.fmean(objectives),
            "objective_min": min(objectives),
            "objective_max": max(objectives),
            "i_precision": mean(lambda m: m.i_precision, self.runs),
            "i_recall": mean(lambda m: m.i_recall, self.runs),
            "i_f1": mean(lambda m: m.i_f1, self.runs),
            "gold_f1_coverage": mean(lambda m: m.gold_f1_coverage, self.runs),
            "parse_rate": mean(lambda m: m.parse_rate, self.runs),
            "agreement": self.agreement,
            "calls": mean(lambda c: c.calls, self.costs),
            "tokens": mean(lambda c: c.prompt_tokens + c.completion_tokens, self.costs),
            "latency_s": mean(lambda c: c.latency_s, self.costs),
            "failures": mean(lambda c: c.failures, self.costs),
        }


def candidate_result(
    policy: TeacherPolicy,
    rows: Sequence[BenchmarkRow],
    runs: Sequence[Sequence[Verdict]],
    costs: Sequence[TeacherStats],
    weights: tuple[float, float] = (0.5, 0.5),
) -> CandidateResult:
    """Score each repeated run (final verdicts in row order) and their agreement."""
    if not runs or len(runs) != len(costs):
        raise ValueError(f"{len(runs)} runs and {len(costs)} cost records; need one each, ≥ 1")
    metrics = tuple(judge_metrics(rows, verdicts, weights) for verdicts in runs)
    return CandidateResult(policy, metrics, tuple(costs), status_agreement(runs))


# --- what E2E-APE's judging will cost --------------------------------------------------------


def ape_requests(
    dev_rows: int,
    holdout_rows: int,
    candidates_a: int,
    candidates_b: int,
    repeats: int,
    dev_chars_a: int,
    dev_chars_b: int,
    holdout_chars_a: int,
    holdout_chars_b: int,
    max_tokens: int,
    controller_calls: int = 0,
    controller_chars: int = 0,
) -> list[RequestGroup]:
    """E2E-APE's controller and teacher requests at most: [controller, stage A, stage B].

    Stage A: every candidate judges every dev row in each of ``repeats`` runs (cache tags
    ``dev:0`` ...); a gated policy's stage A sends its A prompt's single-stage requests again,
    the same messages and tag, answered by the cache; on holdout the selected single-stage and
    gated policies' stage A, once: ``candidates_a`` x R x D + 2 H. Stage B: a request is the B
    prompt's messages for a row, whatever A prompt or gating flags sent it there, so the pairs
    share them: at most every dev row of every B candidate in each run, and every holdout row
    once: ``candidates_b`` x R x D + H. (A reply that breaks the verdict contract is not cached:
    each later policy that needs it asks again, beyond this bound.)

    ``dev_chars_a`` / ``dev_chars_b``: the characters of one run's requests, summed over the
    candidates and the dev rows; ``holdout_chars_a`` / ``_b``: over the holdout rows for the
    longest candidate. Completions: calls x ``max_tokens``.
    """
    r = repeats
    return [
        RequestGroup("controller", controller_calls, controller_chars, max_tokens),
        RequestGroup(
            "teacher stage A",
            candidates_a * r * dev_rows + 2 * holdout_rows,
            r * dev_chars_a + 2 * holdout_chars_a,
            max_tokens,
        ),
        RequestGroup(
            "teacher stage B",
            candidates_b * r * dev_rows + holdout_rows,
            r * dev_chars_b + holdout_chars_b,
            max_tokens,
        ),
    ]


# --- 4. selection and the frozen policy ------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    single: CandidateResult | None
    gated: CandidateResult | None

    @property
    def best(self) -> CandidateResult:
        return _best([r for r in (self.single, self.gated) if r is not None])


def _rank_key(result: CandidateResult) -> tuple:
    s = result.summary()
    # Higher mean objective, then the more stable (higher worst run), then parse rate, then cheaper.
    return (
        -s["objective_mean"],
        -s["objective_min"],
        -s["parse_rate"],
        s["tokens"],
        s["strategy_id"],
    )


def _best(results: Sequence[CandidateResult]) -> CandidateResult:
    if not results:
        raise ValueError("no candidate results to select from")
    return min(results, key=_rank_key)


def select_best(results: Sequence[CandidateResult]) -> Selection:
    """The best single-stage and the best gated policy: highest mean objective over the runs;
    ties go to the higher worst-run objective, the higher parse rate, then fewer tokens."""
    single = [r for r in results if r.policy.stage_b is None]
    gated = [r for r in results if r.policy.stage_b is not None]
    if not results:
        raise ValueError("no candidate results to select from")
    return Selection(_best(single) if single else None, _best(gated) if gated else None)


def write_policy_file(path: str | Path, policy: TeacherPolicy, scores: Mapping[str, Any]) -> None:
    """The frozen policy (strategy id, prompt ids and hashes, gating flags, scores) as YAML
    (``.yaml`` / ``.yml``) or JSON (``.json``)."""
    prompts = {"stage_a": policy.stage_a, "stage_b": policy.stage_b}
    written = {
        f"{p.stage}:{p.instruction}": INSTRUCTIONS[p.stage][p.instruction]
        for p in (get_prompt(v) for v in prompts.values() if v is not None)
        if p.instruction.startswith(WRITTEN_PREFIX)
    }
    data = {
        "strategy_id": policy.strategy_id,
        **{
            k: None if v is None else {"id": v, "hash": get_prompt(v).hash}
            for k, v in prompts.items()
        },
        "gate": list(policy.gate),
        "canonicalize": policy.canonicalize,
        **({"written_instructions": written} if written else {}),
        "scores": dict(scores),
    }
    Path(path).write_text(_dump(Path(path), data), encoding="utf-8")


def read_policy_file(path: str | Path) -> tuple[TeacherPolicy, dict[str, Any]]:
    """(policy, scores) from a frozen policy file; every prompt's hash must match its text now."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))  # YAML reads JSON too
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML/JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    for key in ("strategy_id", "stage_a", "stage_b", "gate", "canonicalize"):
        if key not in data:
            raise ValueError(f"{path}: missing key {key!r}")
    written = data.get("written_instructions") or {}
    if not isinstance(written, dict):
        raise ValueError(f"{path}: written_instructions must map 'stage:name' to a text")
    for key, text in written.items():
        stage_name, _, name = str(key).partition(":")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}: written_instructions.{key}: expected a non-empty text")
        try:
            registered = register_instruction(stage_name, text)
        except ValueError as e:
            raise ValueError(f"{path}: written_instructions.{key}: {e}") from None
        if registered != name:
            raise ValueError(
                f"{path}: written_instructions.{key}: the text does not match its name "
                f"(it is {registered!r})"
            )
    ids = {}
    for stage in ("stage_a", "stage_b"):
        entry = data[stage]
        if entry is None and stage == "stage_b":
            ids[stage] = None
            continue
        if not isinstance(entry, dict) or not {"id", "hash"} <= entry.keys():
            raise ValueError(f"{path}: {stage} must be a mapping with 'id' and 'hash'")
        try:
            prompt = get_prompt(str(entry["id"]))
        except ValueError as e:
            raise ValueError(f"{path}: {stage}: {e}") from None
        if prompt.hash != entry["hash"]:
            raise ValueError(
                f"{path}: {stage} prompt {prompt.id!r} changed since the policy was frozen "
                f"(hash {entry['hash']} in the file, {prompt.hash} now)"
            )
        ids[stage] = prompt.id
    try:
        policy = TeacherPolicy(
            ids["stage_a"], ids["stage_b"], tuple(data["gate"]), bool(data["canonicalize"])
        )
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    if policy.strategy_id != data["strategy_id"]:
        raise ValueError(
            f"{path}: strategy_id {data['strategy_id']!r} does not match its fields "
            f"({policy.strategy_id!r})"
        )
    return policy, dict(data.get("scores") or {})


def _dump(path: Path, data: dict) -> str:
    if path.suffix in (".yaml", ".yml"):
        return yaml.safe_dump(data, sort_keys=False)
    if path.suffix == ".json":
        return json.dumps(data, indent=2) + "\n"
    raise ValueError(f"{path}: a policy file ends in .yaml, .yml or .json")


def results_table(results: Sequence[CandidateResult]) -> str:
    """A markdown table of candidates' summaries, best first."""
    header = (
        "| strategy | objective (min–max) | I-P | I-R | I-F1 | gold-F1 cov. | parse | agree "
        "| calls | tokens | latency s | failures |"
    )
    lines = [header, "|" + "---|" * 12]
    for r in sorted(results, key=_rank_key):
        s = r.summary()
        lines.append(
            f"| `{s['strategy_id']}` | {s['objective_mean']:.4f} ({s['objective_min']:.4f}–"
            f"{s['objective_max']:.4f}) | {s['i_precision']:.4f} | {s['i_recall']:.4f} | "
            f"{s['i_f1']:.4f} | {s['gold_f1_coverage']:.4f} | {s['parse_rate']:.3f} | "
            f"{s['agreement']:.3f} | {s['calls']:.0f} | {s['tokens']:.0f} | "
            f"{s['latency_s']:.1f} | {s['failures']:.0f} |"
        )
    return "\n".join(lines) + "\n"
