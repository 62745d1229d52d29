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
Paid requests: an estimate is printed before the first (``ape_estimate``; the labelling's before
its batch), and ``ape.max_api_calls`` / ``ape.max_api_usd`` stop the command before the request
that would pass them (``ape_budget``: one budget for the labeller, controller and teacher; their
answers stay in ``<out>/cache``, so a rerun with a higher cap pays only for the rest).
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

from common.api_budget import (
    ApiBudget,
    RequestGroup,
    estimate_text,
    messages_chars,
    usage_text,
)
from common.data import QAExample
from common.llm_client import LLMClient
from common.train.distributed import refuse_ranks
from common.train.logging import progress
from eviback.ape import (
    BenchmarkRow,
    CandidateResult,
    ape_requests,
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
from eviback.config import ApeConfig, EviBackConfig
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

PREFIX = "[eviback ape]"
_PROMPT_ID = re.compile(r"\b[AB]-[a-z_]+-[a-z_]+-fs[01]-q[01]-t[01]-[a-z]+-m\d+\b")


def rollout_benchmark(
    cfg: EviBackConfig, labeller: LLMClient | None = None, cap: str = ""
) -> tuple[list[BenchmarkRow], dict[str, int]]:
    """Actor rollouts (sampled, ``ape.rollouts`` per question) labelled by the evidence oracle
    where the question has supporting facts, else by ``labeller`` (``ape.unlabelled=llm``) or
    left out; returns the rows and the counts (``label_rollouts``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.rl_loop import agent_rollouts, build_engine

    a = cfg.assets
    examples = ape_questions(cfg)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = None
    if cfg.engine.backend == "hf":
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    engine = build_engine(cfg.engine, a.model, model, tokenizer, cfg.seed)
    retriever, n = build_retriever(a), cfg.ape.rollouts
    trajs = agent_rollouts(
        engine, tokenizer, retriever, examples, n, cfg.agent, "APE rollouts", group_prefix="ape:"
    )  # a bar of the questions rolled out on stderr
    oracle = EvidenceOracle(cfg.teacher.top_m)
    llm = None if labeller is None else llm_labeller(labeller, cfg.teacher.top_m, cap)
    return label_rollouts(trajs, {ex.id: ex for ex in examples}, oracle.label, llm)


def ape_questions(cfg: EviBackConfig) -> list[QAExample]:
    """``ape.questions`` training questions, a seeded draw from the training set (quotas applied,
    ``select_questions``), so that every source is represented (the first rows of the files
    would all be NQ's at paper scale, which has no supporting facts)."""
    train = select_questions(cfg.assets, "train", cfg.seed, question_chars(cfg.agent, cfg.engine))
    return random.Random(f"ape:{cfg.seed}").sample(train, min(cfg.ape.questions, len(train)))


def llm_labeller(client: LLMClient, top_m: int = 5, cap: str = ""):
    """Labels benchmark items with the controller LLM (``labeller_messages``), in one batch; a
    reply that breaks the contract is an invalid verdict. Before the batch: its estimate (exact
    calls and prompt characters, how many are cached; ``cap``: the command's cap, said)."""

    def label(items: list[TeacherItem]) -> list[Verdict]:
        batch = [labeller_messages(item, top_m) for item in items]
        group = RequestGroup(
            "labeller",
            len(batch),
            sum(messages_chars(m) for m in batch),
            client.max_tokens,
            sum(client.is_cached(m) for m in batch),
            client.prices,
        )
        print(
            estimate_text(
                PREFIX, [group], cap, "API estimate of the labelling (the judging's follows)"
            ),
            flush=True,
        )
        replies = client.chat_many(batch)
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
    messages, tag = controller_request(stage, k)
    result = client.chat(messages, cache_tag=tag)
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


def controller_request(stage: str, k: int) -> tuple[list[dict[str, str]], str]:
    """The controller's request for ``k`` prompt ids of ``stage``: (messages, cache tag)."""
    default = candidate_grid(stage, limit=1)[0]
    instructions = ", ".join(sorted(INSTRUCTIONS[stage]))
    ask = (
        f"We tune the stage-{stage} prompt of an evidence judge. A prompt is named "
        f"{default.id!r}: stage-instruction-answer_rule-fs(few-shot 0/1)-q(sub-queries shown "
        f"0/1{', always 0 for stage B' if stage == 'B' else ''})-t(titles shown 0/1)-"
        f"order(rank|reverse)-m(documents per round). Instructions: {instructions}. "
        f"Propose {k} promising distinct names, one per line, nothing else."
    )
    return [{"role": "user", "content": ask}], f"ape-controller-{stage}"


def writer_request(stage: str, k: int) -> tuple[list[dict[str, str]], str]:
    """The controller's request for ``k`` instruction texts of ``stage``: (messages, cache tag)."""
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
    return [{"role": "user", "content": ask}], f"ape-writer-{stage}"


_WRITTEN = re.compile(r"<instruction>(.*?)</instruction>", re.S)
MAX_WRITTEN_CHARS = 2000  # a longer written instruction is dropped


def controller_written(client: LLMClient, stage: str, k: int) -> list[TeacherPrompt]:
    """Ask the controller to write ``k`` new instruction texts for ``stage`` (each between
    ``<instruction>`` and ``</instruction>``); each becomes a registered instruction in the
    default prompt's layout. Empty, repeated or over-long (> 2,000 characters) texts are
    dropped."""
    if k <= 0:
        return []
    default = candidate_grid(stage, limit=1)[0]
    messages, tag = writer_request(stage, k)
    reply = client.chat(messages, cache_tag=tag)
    found: list[TeacherPrompt] = []
    for text in _WRITTEN.findall(reply.text or ""):
        if not text.strip() or len(text) > MAX_WRITTEN_CHARS:
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


def request_chars(prompt: TeacherPrompt, rows: Sequence[BenchmarkRow]) -> int:
    """The characters of ``prompt``'s requests for ``rows``, summed."""
    refs = (lambda r: r.golden_answers) if prompt.stage == "B" else (lambda r: None)
    return sum(messages_chars(prompt.messages(r.question, r.rounds, refs(r))) for r in rows)


def longest_grid_prompt(stage: str) -> TeacherPrompt:
    """The grid's prompt whose requests are the longest: the longest template, titles (and stage
    A's sub-queries) shown."""
    shown = [p for p in candidate_grid(stage) if p.show_titles and (stage == "B" or p.show_queries)]
    return max(shown, key=lambda p: (len(p.text), p.id))


def ape_estimate(
    ape: ApeConfig,
    teacher: LLMClient,
    controller: LLMClient | None,
    dev: Sequence[BenchmarkRow],
    holdout: Sequence[BenchmarkRow],
    prompts_a: Sequence[TeacherPrompt] | None = None,
    prompts_b: Sequence[TeacherPrompt] | None = None,
) -> list[RequestGroup]:
    """``ape_requests`` measured on this benchmark's rows. Candidates known (``prompts_a`` and
    ``prompts_b``: the grid's, or the controller's once it answered): their requests' exact
    characters, and how many of the dev requests are cached (keys computed, nothing sent). Not
    yet known (a controller still to ask): the controller's requests (exact, cached counted) and
    each candidate at the longest grid prompt's length, a written one at the default prompt's
    with a ``MAX_WRITTEN_CHARS`` instruction; cached not known."""
    reps = ape.repeats
    asks: list[tuple[list[dict[str, str]], str]] = []
    if prompts_a is None or prompts_b is None:
        groups = {"A": (ape.candidates_a, ape.written_a), "B": (ape.candidates_b, ape.written_b)}
        chars, held, count = {}, {}, {}
        for stage, (grid_n, written_n) in groups.items():
            if controller is None:  # not reached by run_ape: the grid is known at once
                written_n = 0
            longest, default = longest_grid_prompt(stage), candidate_grid(stage, limit=1)[0]
            extra = MAX_WRITTEN_CHARS - len(INSTRUCTIONS[stage][default.instruction])
            written = request_chars(default, dev) + len(dev) * max(extra, 0)
            chars[stage] = grid_n * request_chars(longest, dev) + written_n * written
            held[stage] = request_chars(longest, holdout) + len(holdout) * max(extra, 0)
            count[stage] = grid_n + written_n
            if controller is not None:
                asks.append(controller_request(stage, grid_n))
                if written_n > 0:
                    asks.append(writer_request(stage, written_n))
        cached_a = cached_b = None
    else:
        chars = {
            s: sum(request_chars(p, dev) for p in ps)
            for s, ps in (("A", prompts_a), ("B", prompts_b))
        }
        held = {
            s: max(request_chars(p, holdout) for p in ps)
            for s, ps in (("A", prompts_a), ("B", prompts_b))
        }
        count = {"A": len(prompts_a), "B": len(prompts_b)}

        def cached(prompts: Sequence[TeacherPrompt]) -> int:
            return sum(
                teacher.is_cached(
                    p.messages(r.question, r.rounds, r.golden_answers if p.stage == "B" else None),
                    f"dev:{k}",
                )
                for p in prompts
                for r in dev
                for k in range(reps)
            )

        cached_a, cached_b = cached(prompts_a), cached(prompts_b)
    ctl, a, b = ape_requests(
        len(dev),
        len(holdout),
        count["A"],
        count["B"],
        reps,
        chars["A"],
        chars["B"],
        held["A"],
        held["B"],
        teacher.max_tokens,
        len(asks),
        sum(messages_chars(m) for m, _ in asks),
    )
    groups_out = [
        replace(a, cached=cached_a, prices=teacher.prices),
        replace(b, cached=cached_b, prices=teacher.prices),
    ]
    if asks and controller is not None:
        ctl_cached = sum(controller.is_cached(m, tag) for m, tag in asks)
        groups_out.insert(
            0,
            replace(
                ctl, max_tokens=controller.max_tokens, cached=ctl_cached, prices=controller.prices
            ),
        )
    return groups_out


def ape_budget(ape: ApeConfig, cache: Path) -> ApiBudget:
    """The command's API cap (``ape.max_api_calls``, ``ape.max_api_usd``; 0: none), shared by
    the labeller, the controller and the teacher."""
    return ApiBudget.for_section("ape", ape, cache)


def evaluate_policy(
    client: LLMClient,
    policy: TeacherPolicy,
    rows: Sequence[BenchmarkRow],
    repeats: int,
    weights: tuple[float, float],
    tag: str,
) -> CandidateResult:
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
    budget = ape_budget(cfg.ape, out / "cache")
    cap = budget.describe()

    def client(
        endpoint: str, model: str, prices: tuple[float, float], tokenizer: str = ""
    ) -> LLMClient:
        """A client of the command (the teacher's request settings, one cache, one budget)."""
        return llm_client(
            endpoint, model, cfg.teacher, out / "cache", a.api_key_env, budget, prices, tokenizer
        )

    ctl_prices, usage = cfg.ape.controller_usd_per_mtok, {}
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
            labeller = client(a.controller_endpoint, a.controller_model, ctl_prices)
            labeller.probe()  # before the policy model loads for the rollouts
        rows, counts = rollout_benchmark(cfg, labeller, cap)
        if labeller is not None:
            usage["labeller"] = labeller.stats.as_dict()
        counts_file.write_text(json.dumps(counts, indent=2))
        write_benchmark(bench, rows)  # last: its presence says the benchmark is complete
    split = split_by_step if cfg.ape.split == "step" else split_by_question
    dev, holdout = split(rows, cfg.ape.holdout_fraction, cfg.seed)
    teacher = client(
        a.teacher_endpoint, a.teacher_model, cfg.ape.teacher_usd_per_mtok, a.teacher_tokenizer
    )
    teacher.probe()
    controller = None
    if a.controller_endpoint:
        controller = client(a.controller_endpoint, a.controller_model, ctl_prices)
        controller.probe()
        estimate = ape_estimate(cfg.ape, teacher, controller, dev, holdout)
        print(estimate_text(PREFIX, estimate, cap), flush=True)
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
    known = ape_estimate(cfg.ape, teacher, None, dev, holdout, prompts_a, prompts_b)
    what = "API estimate" if controller is None else "API estimate of the judging, candidates known"
    print(estimate_text(PREFIX, known, cap, what), flush=True)
    w, reps = cfg.ape.objective_weights, cfg.ape.repeats
    # each pass a bar on stderr (count, rate, time left): a candidate is ``reps`` runs of the
    # teacher over the dev rows
    single = [
        evaluate_policy(teacher, TeacherPolicy(p.id), dev, reps, w, "dev")
        for p in progress(prompts_a, "APE stage-A prompts", unit="prompt")
    ]
    top_a = sorted(single, key=lambda r: -r.summary()["objective_mean"])[: cfg.ape.gated_from_top]
    pairs = gated_policies([r.policy.stage_a for r in top_a], [p.id for p in prompts_b])
    gated = [
        evaluate_policy(teacher, policy, dev, reps, w, "dev")
        for policy in progress(pairs, "APE gated pairs", unit="pair")
    ]
    selection = select_best(single + gated)
    chosen = [r for r in (selection.single, selection.gated) if r is not None]
    held_runs = [
        policy_runs(teacher, r.policy, holdout, 1, "holdout")
        for r in progress(chosen, "APE holdout", unit="policy")
    ]
    held = [
        candidate_result(r.policy, holdout, *runs, w)
        for r, runs in zip(chosen, held_runs, strict=True)
    ]
    usage["teacher"] = teacher.stats.as_dict()
    if controller is not None:
        usage["controller"] = controller.stats.as_dict()
    print(usage_text(PREFIX, usage), flush=True)
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
