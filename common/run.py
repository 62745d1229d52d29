"""The frame every RL trainer runs in (the reference GRPO loop, EviBack, CER, ARCO), written once,
as verl's ``fit()`` and TRL's ``Trainer`` are: the trainer loads its models and hands the frame
one function, its step, which is the paper's algorithm box and nothing else: it samples,
scores and computes advantages, and returns them as a ``StepBatch``; the frame updates.

    run = Run("grpo", cfg)                       # the run folder: lock, settings check
    ... tokenizer, model, TrainEngine, engine ...  # whatever can fail, before anything is written
    run.begin(train, tokenizer, engine, evaluate)  # settings, env, run.json, log: this start counts
    out = run.fit(step)                            # resume or step-0 eval, steps, schedule, curve

``fit`` resumes after the folder's latest checkpoint (weights, optimizer, RNGs; the weights pushed
into the engine; the evaluations logged before re-read) or evaluates before training; then, per
step: ``step(s)`` -> ``StepBatch``; the update (``update_step``: the non-finite check of its
rewards and advantages, vLLM asleep, the method's update, the weights pushed, each phase timed
and its GPU memory read); the metrics averaged over ranks; batches.jsonl, the non-finite and
health guards
(``guard/*`` metrics; common/guards.py), ``check_step`` (every rank), metrics.jsonl and samples/
(main rank), and ``end_of_step`` (evaluation and checkpoint by ``schedule``; never of
non-finite weights). At the end: an evaluation if none was logged, the dev curve, the folder
released. Rank 0 writes; every rank runs the collectives (evaluation, checkpoint, batches.jsonl)
in the same order.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.batches import BatchLog
from common.guards import (
    HealthError,
    HealthGuard,
    NonFiniteError,
    NonFiniteGuard,
    SleepCheck,
    agreed_nonfinite,
    any_rank,
    nonfinite_parameters,
)
from common.launcher import RunStopped
from common.multinode import check_placement, service_urls
from common.rl_loop import (
    all_ranks_mean,
    logged_evals,
    plot_curve,
    policy_step,
    response_length_metrics,
    skipped_update_stats,
)
from common.rollout import Trajectory
from common.rollout.batch import padding_id
from common.run_config import LossConfig, RunLoopConfig
from common.train import (
    MetricsLogger,
    TrainEngine,
    find_latest_checkpoint,
    iter_named_weights,
    load_checkpoint,
    progress,
    read_metrics,
    save_checkpoint,
)
from common.train.checkpoint import (
    check_checkpoint_space,
    check_resume_ranks,
    checkpoint_bytes,
    planned_saves,
)
from common.train.config import TrainConfig
from common.train.distributed import init_distributed
from common.train.gpu_memory import phase_memory
from common.train.run_folder import METRICS_FILE, open_run_folder


@dataclass
class StepBatch:
    """What a trainer's step hands the frame: the update's inputs and the step's record.

    The frame checks ``rewards`` and ``advantages`` (non-finite on any rank: no update), runs
    the update on ``trajectories`` and ``advantages`` (``policy_step``, or the method's own
    ``update`` given to ``Run.begin``), pushes the weights, and logs ``metrics`` with the
    update's statistics and ``timings`` (``time/*``), averaged over ranks by the trajectory
    count. A method's own update reads the fields of its subclass (ARCO's ``ArcoBatch``)."""

    trajectories: list[Trajectory]  # this rank's, as the update trains on them
    advantages: torch.Tensor | list[list[float]]  # one a trajectory, or one a response token
    rewards: torch.Tensor | None  # checked with the advantages
    question_ids: list[str]  # this rank's questions of the step (batches.jsonl)
    metrics: dict[str, float]  # this rank's (the frame averages them over ranks)
    samples: Callable[[Path], None]  # writes the step's readable samples there (main rank)
    timings: dict[str, float] = field(default_factory=dict)  # the frame adds update, push, step
    pooled: dict[str, float] = field(default_factory=dict)  # already over every rank: as they are


def em_f1_line(m: dict[str, float]) -> str:
    """The printed line of a search agent's dev evaluation."""
    return f"dev EM {m['em']:.3f} F1 {m['f1']:.3f}"


def check_shared_prompt(loss: LossConfig | None, train: TrainConfig, world: int) -> None:
    """``loss.share_prompt`` refused, before any model loads, where it cannot work: under
    gradient checkpointing (HF turns the cache off in training) and under ZeRO-3 on several
    ranks (each forward gathers the weights collectively, and ranks whose micro-batches hold
    different numbers of prompts would make different numbers of forwards). ``loss``: None for
    a method without the clipped loss section (ARCO)."""
    if not getattr(loss, "share_prompt", False):
        return
    if train.gradient_checkpointing:
        raise ValueError(
            "loss.share_prompt=true needs train.gradient_checkpointing=false: under "
            "checkpointing HF keeps no cache in training, and the shared prompt is read from it"
        )
    if world > 1 and train.zero_stage == 3:
        raise ValueError(
            f"loss.share_prompt=true under ZeRO-3 on {world} ranks: every forward gathers the "
            "weights from all ranks, and ranks with different numbers of prompts in a "
            "micro-batch would wait on each other; set loss.share_prompt=false or zero_stage<=2"
        )


def schedule(step: int, cfg: RunLoopConfig) -> tuple[bool, bool]:
    """(evaluate, checkpoint) after step ``step``: an evaluation every ``cfg.eval_every`` steps
    and at the last one (``eval_every=0``: never); a checkpoint every ``cfg.save_every`` steps
    (0: none) and at the last one."""
    last = step == cfg.steps
    evaluate = bool(cfg.eval_every) and (step % cfg.eval_every == 0 or last)
    save = bool(cfg.save_every) and step % cfg.save_every == 0 or last
    return evaluate, save


class Run:
    """One start of an RL run: its folder, engine, logger, evaluations, resume and checkpoints.

    ``method`` ("grpo", "eviback", "cer", "arco") is recorded in run.json and names the run's
    printed lines. Constructing it opens the run folder (``open_run_folder(begin=False)``: the
    lock and the settings check; nothing written) before any model loads.
    """

    def __init__(self, method: str, cfg: RunLoopConfig):
        self.method, self.cfg = method, cfg
        self.dir = Path(cfg.run_dir)
        self.folder = open_run_folder(self.dir, cfg, cfg.resume, begin=False, method=method)
        try:  # under a launcher: one run folder on every node, service URLs every rank reaches
            _, world, _ = init_distributed()
            check_shared_prompt(getattr(cfg, "loss", None), cfg.train, world)
            check_placement(self.dir, service_urls(cfg))
            check_resume_ranks(self.folder.checkpoint, world)
        except BaseException:
            self.folder.close()
            raise
        self.evals: list[dict] = []
        self.logger: MetricsLogger | None = None
        # The run's guards, called on every rank with each step's metrics before they are logged
        # and the step is checkpointed (``check_step``).
        self.step_checks: list[Callable[[int, dict[str, float]], None]] = []
        # Updates skipped for non-finite values, counted per step (common/guards.py).
        self.guard = NonFiniteGuard(cfg.max_nonfinite_in_a_row, method)
        # Steps without signal (every group identical) or from another model (logprob_gap), and
        # vLLM's sleep measured where it is put to sleep (``sleep_engine``; on a GPU).
        self.health = HealthGuard.from_config(cfg, method)
        self.sleep_check = SleepCheck(cfg.min_sleep_freed_share, cfg.engine.gpu_memory_utilization)
        self.step_now = 0  # the step running (``fit``), for the sleep check's line

    def begin(
        self,
        train: TrainEngine,
        tokenizer,
        engine,
        evaluate: Callable[[int], dict[str, float]],
        *,
        push: Callable[[], None] | None = None,
        describe: Callable[[dict[str, float]], str] = em_f1_line,
        plot: Callable[[list[dict], Path], Path] = plot_curve,
        update: Callable[[StepBatch], dict[str, float]] | None = None,
        skipped: Callable[[StepBatch], dict[str, float]] | None = None,
    ) -> None:
        """Record this start once every load-time check passed (``RunFolder.begin``: settings,
        environment, run.json, the log trimmed to the resume point); on the main rank a
        ``resume=false`` start removes the earlier run's checkpoints, and the logger opens.

        evaluate(step): the dev metrics (every rank calls it; it writes its own per-question
        results). push(): the training weights into a vLLM engine, after each update and after
        a checkpoint loads (default: ``push_weights``; an HF engine is the training model).
        describe: the printed line of an evaluation; plot: the dev curve, at the end.
        update(batch): one optimizer step on a checked batch, its statistics (default
        ``policy_step`` with ``cfg.loss``); skipped(batch): the same keys for an update skipped
        for non-finite inputs (default ``skipped_update_stats``).
        """
        self.train, self.tokenizer, self.engine = train, tokenizer, engine
        self.evaluate, self.describe, self.plot = evaluate, describe, plot
        self.push = push or self.push_weights
        self.update = update or self.policy_step
        self.skipped = skipped or self.skipped_policy_step
        self.pad_id = padding_id(tokenizer)
        self.guard.verbose = train.is_main
        # the checkpoints this start will keep, against the disk's free space: a run that cannot
        # fit stops here, before it writes anything
        saves = planned_saves(self.cfg.steps, self.cfg.save_every, max(self.folder.start_step, 1))
        check_checkpoint_space(self.dir, checkpoint_bytes(train), self.cfg.keep_checkpoints, saves)
        self.folder.begin()
        if train.is_main:
            self.start_afresh()
            (self.dir / "samples").mkdir(parents=True, exist_ok=True)
            self.logger = MetricsLogger.from_config(
                self.dir, self.cfg.log, self.cfg, start_step=self.folder.start_step
            )  # TensorBoard and W&B go on from the resume point (common/train/logging.py)

    def fit(self, step: Callable[[int], StepBatch], desc: str | None = None) -> dict:
        """Run the steps from the resume point to ``cfg.steps``; returns the dev evaluations
        (``before``: the first, ``after``: the last, ``evals``), the run folder and the model."""
        cfg = self.cfg
        start = self.resume()
        batch_log = BatchLog(self.dir, start, self.train.is_main)
        steps = range(start, cfg.steps + 1)
        for s in progress(steps, desc=desc or self.method, total=len(steps)):
            updates, self.step_now = self.train.global_step, s
            t0 = time.perf_counter()
            try:
                batch = step(s)
                stats = self.update_step(batch)
            except RunStopped:
                self.save_before_stop(s - 1, updated=self.train.global_step != updates)
                raise
            batch.timings["step"] = time.perf_counter() - t0
            metrics = self.step_metrics(batch, stats)
            batch_log.write(s, batch.question_ids, len(batch.trajectories))
            metrics |= self.observe_skips(s, metrics)
            metrics |= self.observe_health(s, metrics)
            self.check_step(s, metrics)
            if self.logger:
                self.logger.log(s, metrics)
                batch.samples(self.dir / "samples" / f"step_{s:05d}.json")
            self.end_of_step(s)
        if not self.evals and cfg.eval_every:  # resumed after the last step, no evaluation logged
            self.run_eval(cfg.steps)
        self.close()
        return {
            "before": self.evals[0] if self.evals else None,
            "after": self.evals[-1] if self.evals else None,
            "evals": self.evals,
            "run_dir": str(self.dir),
            "model": self.train.model,
        }

    def resume(self) -> int:
        """The first step of this start: after the folder's latest checkpoint (weights, optimizer,
        schedule, RNGs; the data is a function of (seed, step)), its weights pushed into the
        engine and the evaluations logged before it re-read; else 1, after the step-0
        evaluation."""
        latest = self.folder.checkpoint
        if latest is None:
            if self.cfg.eval_every:  # 0: no dev evaluation
                self.run_eval(0)
            return 1
        start = load_checkpoint(self.train, latest)["step"] + 1
        self.push()
        self.evals.extend(logged_evals(self.dir / METRICS_FILE, before=start))
        if (self.dir / METRICS_FILE).exists():  # the guard's counts go on from the log's
            rows = [r for r in read_metrics(self.dir / METRICS_FILE) if r["step"] < start]
            self.guard.restore(rows)
            self.health.restore(rows)
        if self.train.is_main:
            print(f"[{self.method}] resumed from {latest} at step {start}", flush=True)
        return start

    def check_step(self, step: int, metrics: dict[str, float]) -> None:
        """Every rank, each step, before its metrics are logged and it is checkpointed: the run's
        guards (``step_checks``; e.g. failure thresholds, non-finite values, health checks)
        raise here, so a step they refuse is neither logged nor saved."""
        for check in self.step_checks:
            check(step, metrics)

    def observe_skips(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every rank: the step's updates skipped for non-finite values (``TrainEngine``'s
        record) counted by the guard; its metrics (``guard/*``). Raises ``NonFiniteError``
        (nothing of the step logged or saved) at ``max_nonfinite_in_a_row`` skips in a row."""
        reasons = [r for skip in self.train.take_skips() for r in skip]
        try:
            return self.guard.observe(step, reasons, metrics)
        except NonFiniteError as e:
            raise NonFiniteError(f"[{self.method}] {e}; {self.latest_line()}") from None

    def observe_health(self, step: int, metrics: dict[str, float]) -> dict[str, float]:
        """Every rank (the metrics are the ranks' mean): the step's identical groups and
        log-prob gap counted by ``HealthGuard``; its metrics (``guard/*_in_a_row``). Raises
        ``HealthError`` (nothing of the step logged or saved) when a streak reaches its limit."""
        try:
            return self.health.observe(step, metrics)
        except HealthError as e:
            raise HealthError(f"[{self.method}] {e}; {self.latest_line()}") from None

    def sleep_engine(self, engine=None) -> None:
        """Put the vLLM engine (``engine``, default the run's) to sleep, measured on a GPU
        (``SleepCheck``): a sleep that frees less than ``min_sleep_freed_share`` of the planned
        share stops the run (``HealthError``, raised inside the step: ``fit`` saves the last
        finished step as for any stop there). Every trainer's sleep goes through here."""
        try:
            self.sleep_check.sleep(self.engine if engine is None else engine)
        except HealthError as e:
            raise HealthError(f"[{self.method}] step {self.step_now}: {e}") from None

    def asleep_pool(self, asleep: bool) -> int:
        """The bytes of vLLM's pool asleep through the update (what its sleep freed), when
        ``asleep``; ``phase_memory("update", ...)`` leaves them out of the allocator's peak."""
        return self.sleep_check.freed if asleep else 0

    def latest_line(self) -> str:
        latest = find_latest_checkpoint(self.dir)
        return f"latest checkpoint: {latest}" if latest else "no checkpoint was saved"

    def end_of_step(self, step: int) -> None:
        """The evaluation and the checkpoint ``schedule`` asks for after ``step``; a checkpoint
        of non-finite weights (on any rank) is refused: ``NonFiniteError``, ``latest`` kept."""
        evaluate, save = schedule(step, self.cfg)
        if evaluate:
            self.run_eval(step)
        if save:
            self.save(step)

    def save(self, step: int) -> None:
        """The checkpoint of ``step`` (every rank); non-finite weights (on any rank) are
        refused: ``NonFiniteError``, ``latest`` kept."""
        bad = nonfinite_parameters(self.train.model)
        if any_rank([bool(bad)])[0]:
            where = f" ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})" if bad else ""
            raise NonFiniteError(
                f"[{self.method}] step {step}: non-finite weights{where}; refusing to save "
                f"checkpoint step_{step}; {self.latest_line()}"
            )
        save_checkpoint(
            self.train,
            self.dir,
            step,
            {"step": step, "seed": self.cfg.seed},
            keep_last=self.cfg.keep_checkpoints,
            tokenizer=self.tokenizer,
        )

    def save_before_stop(self, done: int, updated: bool) -> None:
        """A stop raised inside step ``done + 1`` (a retrieval outage, a teacher's probe): in one
        process, before that step's update (``updated`` False), the weights are step ``done``'s
        and are saved unless a checkpoint of it exists, so a resume redoes no finished step.
        Under several ranks the launcher ends the others (a save is a collective they are not
        in), and after the update the weights are no step's: there ``latest`` stays."""
        latest = find_latest_checkpoint(self.dir)
        saved = int(latest.name.removeprefix("step_")) if latest else 0
        if updated or done <= saved or self.train.world_size > 1:
            return
        self.save(done)
        if self.train.is_main:
            print(f"[{self.method}] stopped in step {done + 1}: saved step {done}", flush=True)

    def run_eval(self, step: int) -> None:
        """Evaluate (every rank), keep the result, log it as ``dev/*`` (main rank)."""
        m = self.evaluate(step)
        self.evals.append({"step": step, **m})
        if self.logger:
            self.logger.log(step, {f"dev/{k}": v for k, v in m.items()})
            print(f"[{self.method}] step {step}: {self.describe(m)}", flush=True)

    def update_step(self, batch: StepBatch) -> dict[str, float]:
        """The step's update, every rank: its rewards and advantages checked (non-finite on any
        rank: no update, ``skipped``'s statistics; where the method's step has taken micro-steps
        already, ARCO's μ under ``rl.mu_single_forward``, the engine skips the boundary on the
        loss instead), vLLM asleep through it (``nap``), ``update``, then ``push`` into a vLLM
        engine (an HF engine shares the model). ``update`` and ``push`` seconds go into
        ``batch.timings``; returns the update's statistics and, on a GPU, each phase's memory
        (``common.train.gpu_memory``)."""
        self.nap()
        memory = phase_memory("rollout")  # generation, reward and the sleep since the last push
        t0 = time.perf_counter()
        bad = agreed_nonfinite({"reward": batch.rewards, "advantage": batch.advantages})
        if bad and not self.train.pending_micro_batches:
            self.train.skip_update(bad)
            stats = self.skipped(batch)
        else:
            stats = self.update(batch)
        batch.timings["update"] = time.perf_counter() - t0
        vllm = self.cfg.engine.backend == "vllm"
        memory |= phase_memory("update", self.asleep_pool(vllm and self.engine.asleep))
        t0 = time.perf_counter()
        if vllm:  # an engine asleep is woken by the push, in TRL's order
            self.push()
        batch.timings["push"] = time.perf_counter() - t0
        return stats | memory | phase_memory("push")

    def step_metrics(self, batch: StepBatch, stats: dict[str, float]) -> dict[str, float]:
        """The step's metrics, the update's statistics and its timings (``time/*``), averaged
        over ranks by trajectory count (counts summed: ``all_ranks_mean``), and the pooled ones."""
        timings = {f"time/{k}": v for k, v in batch.timings.items()}
        mine = {**batch.metrics, **stats, **timings}
        return all_ranks_mean(mine, len(batch.trajectories)) | batch.pooled

    def policy_step(self, batch: StepBatch) -> dict[str, float]:
        """The default update: the clipped surrogate over the batch (``cfg.loss``)."""
        return policy_step(
            self.train, batch.trajectories, batch.advantages, self.cfg.loss, self.pad_id
        )

    def skipped_policy_step(self, batch: StepBatch) -> dict[str, float]:
        """``policy_step``'s statistics for an update skipped before its first micro-batch."""
        stats = skipped_update_stats(self.cfg.loss, self.train)
        return stats | response_length_metrics(batch.trajectories)

    def nap(self) -> None:
        """A vLLM engine put to sleep now (``engine.sleep_during_update``), unless asleep: the
        frame's before each update, a method's where its own work needs the memory earlier
        (CER's scoring forward, ARCO's μ); the push after the update wakes it."""
        engine_cfg = self.cfg.engine
        sleeps = engine_cfg.backend == "vllm" and engine_cfg.sleep_during_update
        if sleeps and not self.engine.asleep:
            self.sleep_engine()

    def push_weights(self) -> None:
        """The training weights into a vLLM engine (an HF engine generates with them)."""
        if self.cfg.engine.backend == "vllm":
            self.engine.push_weights(iter_named_weights(self.train))

    def start_afresh(self) -> None:
        """``resume=false``: this start replaces the run, so the earlier run's checkpoints go too
        (a later resume would otherwise continue the earlier run under this one's log)."""
        ckpts = self.dir / "checkpoints"
        if self.cfg.resume or not ckpts.is_dir():
            return
        shutil.rmtree(ckpts)
        print(f"[{self.method}] resume=false: removed the earlier run's {ckpts}", flush=True)

    def close(self) -> None:
        """The logger closed, the dev curve drawn (main rank), the folder released."""
        if self.logger:
            self.logger.close()
            if self.evals:
                self.plot(self.evals, self.dir / "dev_curve.png")
        self.folder.close()
