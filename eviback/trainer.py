"""`eviback train`: GRPO on the search agent with the evidence-constrained teacher backoff.

    questions -> n rollouts each (vLLM) -> EM -> all-zero groups: teacher on each rollout's
    evidence -> r_i = β·supported_i + γ·eligible_i·F1_i -> advantages, λ-scaled for those
    groups -> clipped update -> weights pushed -> next rollouts

``teacher.enabled=false`` leaves every reward at EM with scale 1: the Search-R1 GRPO baseline,
same loop. The reward and the estimator come from the config (``reward.fn``, default EviBack's
``eviback.backoff:teacher_backoff_reward``; ``reward.advantage``, default ``backoff``), given the
teacher's verdicts. The frame that does not change between methods (run folder, evaluation,
resume, checkpoints) is ``common.run``'s.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

from common.batches import rank_questions
from common.config import ConfigError
from common.data import QAExample
from common.launcher import RunStopped
from common.redact import redact
from common.retrieval.client import probe_retrieval
from common.rewards import RewardContext, groups_of
from common.rl_loop import (
    build_engine,
    dev_results_path,
    evaluate,
    identical_group_share,
    rollout_metrics,
    step_rollouts,
)
from common.rollout import Trajectory
from common.run import Run, StepBatch
from common.token_counts import rollout_token_metrics
from common.train import (
    TrainEngine,
    load_for_training,
)
from common.train.distributed import all_reduce_values
from common.train.memory_plan import announce_plan
from common.train.run_folder import RunFolder
from eviback.assets import (
    build_retriever,
    build_teacher,
    load_questions,
    question_chars,
    select_questions,
)
from eviback.backoff import Backoff, TeacherVerdicts, backoff_rewards, reward_of
from eviback.config import AssetsConfig, EviBackConfig, TeacherConfig
from eviback.prompts import rounds_from_trajectory
from eviback.reward import (
    actor_em,
    fallback_advantage_share,
    rollout_facts,
)
from eviback.teacher import STAGES, Judgement, Teacher, TeacherItem, TeacherStats


def teacher_items(
    trajs: Sequence[Trajectory], examples: Mapping[str, QAExample], em_gate: bool = True
) -> tuple[list[int], list[TeacherItem]]:
    """What the teacher is asked: every rollout with search evidence in an all-zero group (no
    rollout with EM 1; ``em_gate``: EM counts only from a well-formed trajectory), as positions
    in ``trajs`` and teacher items. ``trajs`` holds whole groups.
    """
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(t.group_id, []).append(i)
    asked = [
        i
        for idx in groups.values()
        if not any(actor_em(trajs[i], em_gate) for i in idx)
        for i in idx
        if rollout_facts(trajs[i]).has_evidence
    ]
    items = [
        TeacherItem(
            trajs[i].question,
            rounds_from_trajectory(trajs[i]),
            trajs[i].golden_answers,
            examples[trajs[i].question_id].metadata,
        )
        for i in asked
    ]
    return asked, items


def teacher_backoff(
    trajs: Sequence[Trajectory],
    examples: Mapping[str, QAExample],
    teacher: Teacher | None,
    cfg: TeacherConfig,
    em_gate: bool = True,
) -> Backoff:
    """``backoff_rewards`` after asking the teacher about the whole batch at once (one call)."""
    judged, stats = teacher_verdicts(trajs, examples, teacher, em_gate)
    return backoff_rewards(trajs, judged, stats, cfg if teacher is not None else None, em_gate)


def teacher_verdicts(
    trajs: Sequence[Trajectory],
    examples: Mapping[str, QAExample],
    teacher: Teacher | None,
    em_gate: bool = True,
) -> tuple[list[Judgement | None], TeacherStats]:
    """The teacher's judgement of each rollout it is asked about (``teacher_items``; None
    elsewhere, and everywhere without a teacher), asked in one call, and its stats."""
    judged: list[Judgement | None] = [None] * len(trajs)
    stats = TeacherStats()
    if teacher is not None:
        asked, items = teacher_items(trajs, examples, em_gate)
        if items:
            judgements, stats = teacher.judge(items)
            for i, j in zip(asked, judgements, strict=True):
                judged[i] = j
    return judged, stats


class TeacherOverlap:
    """Asks the teacher about each all-zero group as soon as its rollouts are done, in background
    threads, while the other questions of the step still roll out (``run_agent``'s
    ``on_group_done``); ``collect`` waits for the answers. Same judgements as ``teacher_backoff``.
    """

    def __init__(
        self,
        teacher: Teacher,
        examples: Mapping[str, QAExample],
        workers: int = 1,
        em_gate: bool = True,
    ):
        self.teacher = teacher
        self.examples = examples
        self.em_gate = em_gate
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="teacher")
        self.pending: list[tuple[list[Trajectory], Future]] = []

    def submit(self, group: list[Trajectory]) -> None:
        asked, items = teacher_items(group, self.examples, self.em_gate)
        if items:
            chosen = [group[i] for i in asked]
            self.pending.append((chosen, self.pool.submit(self.teacher.judge, items)))

    def collect(self, trajs: Sequence[Trajectory]) -> tuple[list[Judgement | None], TeacherStats]:
        """The judgements of ``trajs`` (None where not asked) and their summed stats."""
        by_traj: dict[int, Judgement] = {}
        stats = TeacherStats()
        for chosen, future in self.pending:
            judgements, part = future.result()
            stats.add(part)
            by_traj.update({id(t): j for t, j in zip(chosen, judgements, strict=True)})
        self.pending = []
        return [by_traj.get(id(t)) for t in trajs], stats

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def train_eviback(cfg: EviBackConfig) -> dict:
    """Run the loop; returns the dev evaluations (first = before training, last = after)."""
    from transformers import AutoTokenizer

    # the batch is global: each rank's share, checked before any load (EviBackConfig.DERIVED)
    cfg.set_grad_accum()
    cfg.check_assets(("model", "train", "dev", "retrieval", "teacher"))
    cfg.train.total_steps = cfg.steps
    cfg.train.seed = cfg.seed
    a = cfg.assets
    # bad rows stop here, before any model loads; over-long questions are counted skips
    chars = question_chars(cfg.agent, cfg.engine)
    train_set = select_questions(a, "train", cfg.seed, chars)
    dev_set = load_questions(
        a.files("dev"),
        {},
        cfg.seed,
        where=a.dev_where,
        where_key="dev_where",
        max_question_chars=chars,
    )
    dev_set = random.Random(cfg.seed).sample(dev_set, min(cfg.eval_questions, len(dev_set)))
    run = Run("eviback", cfg)  # the run folder: lock, settings check
    try:
        # the frozen APE policy, unchanged
        policy_sha = check_policy_file(run.dir, cfg.teacher, run.folder, cfg.allow_config_change)
        # every rank asks the endpoint before any model loads: it answers and serves the model
        teacher = build_teacher(a, cfg.teacher, run.dir / "teacher_cache", probe=True)
        probe_retrieval(a.retrieval_url)  # and the retrieval server answers a query
    except (ConfigError, RunStopped):
        run.close()
        raise
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    announce_plan(cfg)  # on a GPU: the memory plan, before the model loads
    model = load_for_training(a.model, cfg.train, partition=cfg.loss.kl_coef == 0)
    train = TrainEngine(model, cfg.train, reference=cfg.loss.kl_coef > 0)
    engine = build_engine(cfg.engine, a.model, train.model, tokenizer, cfg.seed + train.rank)
    retriever = build_retriever(a)
    by_id = {ex.id: ex for ex in train_set}
    overlap = (
        TeacherOverlap(teacher, by_id, cfg.teacher.workers, cfg.em_well_formed)
        if teacher is not None and cfg.teacher.overlap
        else None
    )
    order = list(range(len(train_set)))
    random.Random(cfg.seed).shuffle(order)
    reward_fn, estimator = reward_of(cfg.reward), cfg.reward.estimator()

    def dev_eval(step: int) -> dict[str, float]:
        results = dev_results_path(run.dir, step)
        rank, world = train.rank, train.world_size
        return evaluate(
            engine, tokenizer, retriever, dev_set, cfg.agent, rank, world, results_path=results
        )

    def eviback_step(step: int) -> StepBatch:
        """n rollouts of each question -> EM -> the teacher on all-zero groups' evidence ->
        backoff rewards and λ-scaled advantages (the frame updates)."""
        # this rank's contiguous share of the one-rank batch: a function of (seed, step)
        idx = rank_questions(step, train.rank, train.world_size, order, cfg.questions_per_step)
        qs = [train_set[i] for i in idx]
        timings: dict[str, float] = {}
        trajs = step_rollouts(
            engine,
            tokenizer,
            retriever,
            qs,
            cfg.n,
            cfg.agent,
            step,
            train.rank,
            cfg.seed,
            timings=timings,
            on_group_done=overlap.submit if overlap else None,
        )
        t0 = time.perf_counter()  # with the overlap: only the wait for the last answers
        judged, stats = (
            overlap.collect(trajs)
            if overlap
            else teacher_verdicts(trajs, by_id, teacher, cfg.em_well_formed)
        )
        timings["teacher"] = time.perf_counter() - t0
        # each stage's requests without a usable verdict, over all ranks; a stage past
        # teacher.max_failure_share stops the run here, before the update, so the frame saves
        # the last finished step (Run.fit), as for a retrieval outage
        stage_counts = all_reduce_values(
            [stats.invalid_a, stats.calls_a, stats.invalid_b, stats.calls_b]
        )
        if teacher is not None:
            check_teacher_failures(step, stage_counts, cfg.teacher, a)
        verdicts = TeacherVerdicts(
            judged, stats, cfg.em_well_formed, cfg.teacher if teacher is not None else None
        )
        ctx = RewardContext(train.model, tokenizer, engine, step, teacher=verdicts)
        out = reward_fn(groups_of(trajs), ctx)
        adv = estimator(out, [t.group_id for t in trajs], None)
        # what samples/ shows: the backoff's record, or (another reward) EM with its values
        b = out.extras.get("backoff") or replace(
            backoff_rewards(trajs, judged, stats, None, cfg.em_well_formed), rewards=out.values
        )
        metrics = {
            **rollout_metrics(trajs),
            **identical_group_share(trajs, cfg.n),
            **out.metrics,
            "reward": out.values.mean().item(),
            "backoff_adv_share": fallback_advantage_share(adv, b.fell_back),
            **rollout_token_metrics(trajs),  # the teacher is external: teacher/tokens
        }
        pooled = teacher_failure_shares(stage_counts) if teacher is not None else {}
        return StepBatch(
            trajs,
            adv,
            out.values,
            [q.id for q in qs],
            metrics,
            lambda path: write_samples(path, trajs, b, adv, cfg.samples_per_step, tokenizer),
            timings,
            pooled,  # over all ranks already: the same on every rank
        )

    run.begin(train, tokenizer, engine, dev_eval)  # every load-time check passed
    if train.is_main:
        record_policy_file(run.dir, cfg.teacher.policy_file, policy_sha)
    out = run.fit(eviback_step)
    if overlap:
        overlap.close()
    return out


def teacher_failure_shares(counts: Sequence[float]) -> dict[str, float]:
    """Each stage's share of teacher requests without a usable verdict, and both together, from
    ``[failed_a, calls_a, failed_b, calls_b]`` over all ranks."""
    failed_a, calls_a, failed_b, calls_b = counts
    calls = calls_a + calls_b
    return {
        "teacher/failure_share": (failed_a + failed_b) / calls if calls else 0.0,
        "teacher/failure_share_a": failed_a / calls_a if calls_a else 0.0,
        "teacher/failure_share_b": failed_b / calls_b if calls_b else 0.0,
    }


def check_teacher_failures(
    step: int, counts: Sequence[float], teacher: TeacherConfig, assets: AssetsConfig
) -> None:
    """Stop the run (``RunStopped``, one line) when either stage's share of the step's teacher
    requests, over all ranks, that gave no usable verdict (failed after their retries, came from
    another model, or broke the verdict contract after ``teacher.contract_retries``) exceeds
    ``teacher.max_failure_share``. ``counts``: (stage A failed, stage A calls, stage B failed,
    stage B calls). Each stage on its own: stage B makes at most as many requests as stage A,
    so a dead stage B never took the two stages' share past 0.5 and the run trained on stage
    A's verdicts alone. Called inside the step before its update: ``Run.fit`` saves the last
    finished step (in one process) before the stop goes on up."""
    limit, where = teacher.max_failure_share, assets.teacher_endpoint
    shares = {
        stage: (failed / calls, int(calls))
        for stage, failed, calls in (("A", *counts[:2]), ("B", *counts[2:]))
        if calls
    }
    over = [stage for stage, (share, _) in shares.items() if share > limit]
    if not over:
        return
    share, calls = shares[over[0]]
    others = "; ".join(
        f"{STAGES[s]}: {sh:.0%} of {n}" for s, (sh, n) in shares.items() if s != over[0]
    )
    raise RunStopped(
        f"step {step}: {share:.0%} of the teacher's {STAGES[over[0]]} requests ({calls} over all "
        f"ranks) to {redact(where)} (model {assets.teacher_model}) failed after their "
        f"retries, came from another model or broke the verdict contract, over "
        f"teacher.max_failure_share={limit:g} (each stage on its own)"
        f"{'; ' + others if others else ''}; the warnings above name the errors"
    )


POLICY_RECORD = "teacher_policy.json"


def check_policy_file(
    run_dir: Path, teacher: TeacherConfig, folder: RunFolder, allow_config_change: bool = False
) -> str | None:
    """The sha256 of ``teacher.policy_file`` (None: none set, or the teacher is off). A resume
    whose policy file differs from the one the run started with (``run_dir/teacher_policy.json``)
    is a ``ConfigError`` unless ``allow_config_change``: its steps would be judged by another
    teacher. Call before any model loads; nothing is written here."""
    policy = teacher.policy_file
    if not (teacher.enabled and teacher.backend == "llm" and policy):
        return None
    sha = hashlib.sha256(Path(policy).read_bytes()).hexdigest()
    record = run_dir / POLICY_RECORD
    if folder.checkpoint is None or not record.is_file() or allow_config_change:
        return sha
    saved = json.loads(record.read_text(encoding="utf-8"))
    if saved.get("sha256") != sha:
        raise ConfigError(
            f"teacher.policy_file {policy} (sha256 {sha[:12]}) is not the policy run_dir "
            f"{run_dir} started with ({saved.get('file')}, sha256 {str(saved.get('sha256'))[:12]}"
            f", {record}); restore it, set allow_config_change=true, or set resume=false"
        )
    return sha


def record_policy_file(run_dir: Path, policy: str, sha: str | None) -> None:
    """``run_dir/teacher_policy.json``: the policy file this start judges with (removed when
    none is used)."""
    record = run_dir / POLICY_RECORD
    if sha is None:
        record.unlink(missing_ok=True)
        return
    record.write_text(json.dumps({"file": policy, "sha256": sha}) + "\n", encoding="utf-8")


def write_samples(
    path: Path,
    trajs: Sequence[Trajectory],
    b: Backoff,
    adv: torch.Tensor,
    k: int,
    tokenizer,
) -> None:
    """The first ``k`` rollouts of fallback groups (else of the batch), readable, with verdicts."""
    pick = [i for i, fb in enumerate(b.fell_back) if fb][:k] or list(range(min(k, len(trajs))))
    rows = []
    for i in pick:
        row = trajs[i].to_json(tokenizer)
        for key in ("prompt_ids", "response_ids", "loss_mask", "sampling_logprobs"):
            row.pop(key)
        j = b.judgements[i]
        rows.append(
            {
                "em": b.em[i],
                "reward": b.rewards[i].item(),
                "advantage": adv[i].item(),
                "fell_back": b.fell_back[i],
                "verdict": None if j is None else asdict(j),
                **row,
            }
        )
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False))
