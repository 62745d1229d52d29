"""Non-finite guards of a long RL run: a NaN or an inf never reaches the weights or a checkpoint.

Where each check runs (docs/run_folders.md, "Non-finite guards"):

* ``common.rl_loop.policy_update``: the step's rewards and advantages, before any forward
  (``agreed_nonfinite``: one flag a quantity, all-reduced, so every rank skips the same update);
* ``common.train.engine.TrainEngine``: every micro-batch's loss (a non-finite one turns its
  backward into NaN gradients) and the gradient norm at the optimizer step, which is skipped
  (weights, optimizer state and schedule as before, gradients dropped) on every rank alike;
* ``common.run.Run``: each step's skipped updates counted (``NonFiniteGuard``: metrics, a warning
  line, a stop after ``max_nonfinite_in_a_row``), a step that looks collapsed reported
  (``collapsed``), and no checkpoint of non-finite weights (``nonfinite_parameters``).

The counting and the collapse rule are plain functions of their inputs; only ``agreed_nonfinite``
and ``any_rank`` are collectives (every rank calls them, in the same order).

Health guards (a run on a GPU that would train on nothing stops instead; docs/run_folders.md):

* ``HealthGuard`` (``common.run.Run``, every trainer, each step's logged metrics): every group's
  rollouts token-identical (``identical_group_share`` 1.0) for ``max_identical_groups_in_a_row``
  steps in a row, or ``logprob_gap`` over ``logprob_gap_limit`` for ``max_logprob_gap_in_a_row``
  steps in a row;
* ``SleepCheck`` (wherever vLLM sleeps: ``Run.sleep_engine``): the device's use read before and
  after the sleep; less freed than ``min_sleep_freed_share`` of what the memory plan frees stops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from common.launcher import RunStopped
from common.train import gpu_memory
from common.train.distributed import any_rank
from common.train.gpu_memory import GIB, note_device_use, release_cached

SKIPPED = "guard/skipped_update"
SKIPPED_TOTAL = "guard/skipped_updates_total"
COLLAPSED = "guard/collapsed"
# a step "looks collapsed" when each of these is exactly 0 (every key of a group the step logs)
COLLAPSE_KEYS: tuple[tuple[str, ...], ...] = (
    ("loss", "loss_pi"),  # the policy loss (ARCO: L_pi)
    ("grad_norm",),
    ("accuracy", "reward", "em"),  # what the rollouts scored
)
# the share of rollouts that gave an answer (search agents; CER: an answer found in the response)
ANSWERING_KEYS = ("valid_answer_rate", "boxed_rate")


class NonFiniteError(RunStopped):
    """The run stopped on non-finite numbers: too many updates in a row skipped, or weights that
    would have been checkpointed. One line (``common.launcher.run_command`` prints it, exit code
    3); the checkpoint ``latest`` names is from before, and intact."""


def is_finite(value: Any) -> bool:
    """Whether every number in ``value`` is finite: a tensor, a number, or (nested) sequences of
    them; None and empty ones are."""
    if value is None:
        return True
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()):
            return True
        return bool(torch.isfinite(value).all())
    if isinstance(value, int | float):
        return math.isfinite(value)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return all(is_finite(v) for v in value)
    raise TypeError(f"is_finite: cannot read numbers from {type(value).__name__}")


def nonfinite(name: str, value: Any) -> str | None:
    """``name`` when ``value`` holds a NaN or an inf, else None."""
    return None if is_finite(value) else name


def agreed_nonfinite(values: Mapping[str, Any]) -> list[str]:
    """The names whose value is non-finite on any rank (one all-reduce of one flag a name; every
    rank calls it with the same names, in the same order)."""
    names = list(values)
    bad = any_rank([not is_finite(values[n]) for n in names])
    return [n for n, b in zip(names, bad, strict=True) if b]


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """The names of ``model``'s parameters that hold a NaN or an inf, in this rank's share (a
    ZeRO-3 parameter's partition, ``ds_tensor``; the whole tensor otherwise)."""
    bad = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            held = getattr(p, "ds_tensor", p)
            if held.numel() and not bool(torch.isfinite(held).all()):
                bad.append(name)
    return bad


def collapse_values(metrics: Mapping[str, Any]) -> list[float] | None:
    """The values ``collapsed`` compares (``COLLAPSE_KEYS``: every key of each group the step
    logs), or None when a group has none of its keys (nothing to judge)."""
    out: list[float] = []
    for keys in COLLAPSE_KEYS:
        present = [float(metrics[k]) for k in keys if isinstance(metrics.get(k), int | float)]
        if not present:
            return None
        out += present
    return out


def collapsed(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    """Whether the step ``after`` looks collapsed: its loss, gradient norm and accuracy/reward
    all exactly 0 where the step ``before`` had one of them non-zero (a learning rate that
    wrecked the model in one update: it answers nothing, so every advantage and gradient is 0).
    A step whose rollouts still answer (a search step's ``valid_answer_rate`` > 0, CER's
    ``boxed_rate``) is not: every answer wrong and no other reward is a step without signal,
    common where most groups are all-zero (EviBack at ``SCALE=smol``: 85% of groups; exact
    match on SmolLM2's free answers: 2 right samples of 256)."""
    if any(float(after.get(k, 0.0)) > 0.0 for k in ANSWERING_KEYS):
        return False
    now = collapse_values(after)
    then = collapse_values(before) if before is not None else None
    if now is None or then is None:
        return False
    return all(v == 0.0 for v in now) and not all(v == 0.0 for v in then)


@dataclass
class NonFiniteGuard:
    """Counts the steps whose optimizer update was skipped for non-finite numbers and stops the
    run after ``max_in_a_row`` of them in a row (0: never); reports a step that looks collapsed.

        guard = NonFiniteGuard(3, "cer", verbose=train.is_main)
        metrics |= guard.observe(step, reasons, metrics)    # raises NonFiniteError

    ``reasons``: what was non-finite in the step's skipped update(s) (e.g. ``["advantage"]``),
    empty when the update was applied. Every rank observes the same reasons (the skip is agreed)
    and so counts and raises alike; ``verbose`` prints the warning lines (the main rank).
    """

    max_in_a_row: int = 3
    method: str = "run"
    verbose: bool = True
    total: int = 0
    in_a_row: int = 0
    previous: dict[str, Any] | None = field(default=None, repr=False)

    def observe(
        self, step: int, reasons: Sequence[str], metrics: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        """Count step ``step``; its guard metrics (``guard/skipped_update`` 0 or 1,
        ``guard/skipped_updates_total``, ``guard/collapsed`` 0 or 1). Raises ``NonFiniteError``
        when this skip is the ``max_in_a_row``-th in a row."""
        skipped = bool(reasons)
        if skipped:
            self.total += 1
            self.in_a_row += 1
            what = ", ".join(dict.fromkeys(reasons))
            if self.max_in_a_row and self.in_a_row >= self.max_in_a_row:
                raise NonFiniteError(
                    f"step {step}: {self.in_a_row} optimizer updates in a row skipped for "
                    f"non-finite values (this one: {what}; max_nonfinite_in_a_row="
                    f"{self.max_in_a_row})"
                )
            self.say(
                f"step {step}: non-finite {what}: optimizer update skipped (weights and "
                f"optimizer unchanged; {self.in_a_row} in a row, {self.total} in all"
                + (
                    f", the run stops at {self.max_in_a_row} in a row)"
                    if self.max_in_a_row
                    else ")"
                )
            )
        else:
            self.in_a_row = 0
        out = {SKIPPED: float(skipped), SKIPPED_TOTAL: float(self.total)}
        is_collapsed = metrics is not None and collapsed(self.previous, metrics)
        if is_collapsed:
            self.say(
                f"step {step}: loss, gradient norm and reward/accuracy are all exactly 0 after "
                "an update where they were not: the model looks collapsed (learning rate too "
                "high?)"
            )
        out[COLLAPSED] = float(is_collapsed)
        if metrics is not None:
            self.previous = dict(metrics)
        return out

    def restore(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Continue the counts of an earlier start from its logged step rows (metrics.jsonl,
        before the resume point, in order): the running total, the skips in a row at its end,
        the last step's metrics (the collapse check's ``before``)."""
        steps = [r for r in rows if SKIPPED in r]
        if not steps:
            return
        self.total = int(steps[-1].get(SKIPPED_TOTAL, 0))
        self.in_a_row = 0
        for r in reversed(steps):
            if not r[SKIPPED]:
                break
            self.in_a_row += 1
        self.previous = {k: v for k, v in steps[-1].items() if k != "step"}

    def say(self, line: str) -> None:
        if self.verbose:
            print(f"[{self.method}] warning: {line}", flush=True)


# --- health guards: a run that trains on nothing stops -------------------------------------------

IDENTICAL = "identical_group_share"
GAP = "logprob_gap"
IDENTICAL_IN_A_ROW = "guard/identical_groups_in_a_row"
GAP_IN_A_ROW = "guard/logprob_gap_over_limit_in_a_row"


class HealthError(RunStopped):
    """The run stopped because it trained, or would train, on nothing: every group's rollouts
    identical step after step, an engine that samples from another model than the one trained,
    or a vLLM sleep that left its memory on the device. One line, exit code 3
    (``common.launcher.run_command``), as ``NonFiniteError``."""


def measured(metrics: Mapping[str, Any], key: str) -> float | None:
    """``metrics[key]`` where the step measured it: None when absent (``identical_group_share``
    of a step with one rollout a question) or NaN (``logprob_gap`` of an update that forwarded
    no sampled token: every advantage 0, or a skipped update)."""
    value = metrics.get(key)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def next_streak(in_a_row: int, value: float | None, bad: bool) -> int:
    """The streak after a step: one more when the step's value is ``bad``, 0 when it is not,
    unchanged when the step measured nothing (``value`` None)."""
    if value is None:
        return in_a_row
    return in_a_row + 1 if bad else 0


@dataclass
class HealthGuard:
    """Stops a run whose steps carry no signal or the wrong one, from each step's metrics (as
    logged: over several ranks, the ranks' mean, so every rank counts and raises alike).

        guard = HealthGuard(5, 0.1, 3, "cer")
        metrics |= guard.observe(step, metrics)    # raises HealthError

    * every group identical: ``identical_group_share`` 1.0 (each group's rollouts token for
      token the same, so every advantage is 0) in ``max_identical_in_a_row`` steps in a row;
    * ``logprob_gap`` (mean |log pi_train - log pi_engine| over sampled tokens) over
      ``gap_limit`` in ``max_gap_in_a_row`` steps in a row: the engine samples from another model
      than the trained one (weights never pushed, a bf16 rotary buffer).

    A step that did not measure a quantity (no ``identical_group_share``: one rollout a
    question; a NaN ``logprob_gap``: no sampled token forwarded) neither counts toward its streak
    nor resets it. 0 disables a guard.
    """

    max_identical_in_a_row: int = 5
    gap_limit: float = 0.1
    max_gap_in_a_row: int = 3
    method: str = "run"
    identical_in_a_row: int = 0
    gap_in_a_row: int = 0

    @classmethod
    def from_config(cls, cfg: Any, method: str) -> HealthGuard:
        """The guard of a run config (``common.run_config.RunLoopConfig``'s keys)."""
        return cls(
            cfg.max_identical_groups_in_a_row,
            cfg.logprob_gap_limit,
            cfg.max_logprob_gap_in_a_row,
            method,
        )

    def count(self, metrics: Mapping[str, Any]) -> None:
        """The streaks after a step with these metrics (no stop)."""
        same = measured(metrics, IDENTICAL)
        self.identical_in_a_row = next_streak(
            self.identical_in_a_row, same, same is not None and same >= 1.0
        )
        gap = measured(metrics, GAP)
        self.gap_in_a_row = next_streak(
            self.gap_in_a_row, gap, gap is not None and gap > self.gap_limit
        )

    def observe(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Count step ``step``; its metrics (``guard/identical_groups_in_a_row``,
        ``guard/logprob_gap_over_limit_in_a_row``). Raises ``HealthError`` when a streak reaches
        its limit."""
        before = (self.identical_in_a_row, self.gap_in_a_row)
        self.count(metrics)  # a limit is reached only by a step that measured its quantity
        k, n = self.max_identical_in_a_row, self.identical_in_a_row
        if k and n >= k and n > before[0]:
            raise HealthError(
                f"step {step}: every group's rollouts were token-identical (identical_group_share "
                f"1.0) in {n} steps in a row (max_identical_groups_in_a_row={k}): no group has an "
                "advantage to learn from (on a GPU: one sampling seed for a group's requests?)"
            )
        k, n = self.max_gap_in_a_row, self.gap_in_a_row
        if k and n >= k and n > before[1]:
            raise HealthError(
                f"step {step}: logprob_gap {float(metrics[GAP]):.4f} over logprob_gap_limit="
                f"{self.gap_limit:g} in {n} steps in a row (max_logprob_gap_in_a_row={k}): the "
                "engine samples from another model than the one trained (weights not pushed, a "
                "bf16 rotary buffer, another checkpoint?)"
            )
        return {
            IDENTICAL_IN_A_ROW: float(self.identical_in_a_row),
            GAP_IN_A_ROW: float(self.gap_in_a_row),
        }

    def restore(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Continue the streaks of an earlier start from its logged rows (metrics.jsonl, before
        the resume point, in order), replayed under this start's limits."""
        self.identical_in_a_row = self.gap_in_a_row = 0
        for r in rows:
            self.count(r)


def planned_sleep_freed(gpu_memory_utilization: float, total: int) -> float:
    """What the memory plan has vLLM's sleep free on a GPU of ``total`` bytes: its share
    (``engine.gpu_memory_utilization`` x the GPU) less what it keeps asleep (``VLLM_ASLEEP_BYTES``:
    CUDA graphs and buffers outside the sleep pool; ``common.train.memory_plan``)."""
    from common.train.memory_plan import VLLM_ASLEEP_BYTES

    return gpu_memory_utilization * total - VLLM_ASLEEP_BYTES


def sleep_freed_problem(
    used_before: int, used_after: int, expected_freed: float, min_share: float
) -> str | None:
    """Why a vLLM sleep freed too little, or None: the device's use (bytes) before and after the
    sleep against ``min_share`` of ``expected_freed`` (``planned_sleep_freed``). Nothing is
    judged where the plan expects nothing freed or ``min_share`` is 0."""
    if min_share <= 0 or expected_freed <= 0:
        return None
    freed = used_before - used_after
    if freed >= min_share * expected_freed:
        return None
    return (
        f"vLLM's sleep freed {freed / GIB:.2f} GiB of the device ({used_before / GIB:.2f} -> "
        f"{used_after / GIB:.2f} GiB in use), less than min_sleep_freed_share={min_share:g} of "
        f"the {expected_freed / GIB:.2f} GiB its memory plan frees (engine.gpu_memory_utilization "
        "x the GPU, less what it keeps asleep): the update would run beside vLLM's memory"
    )


@dataclass
class SleepCheck:
    """A vLLM engine put to sleep with the device's use read around it (``reader``: (bytes in
    use, total bytes), None without a device: the engine then just sleeps; default
    ``gpu_memory.device_memory``). Torch's cached blocks are released first (vLLM's sleep empties
    the cache too, which would count as freed).

        check = SleepCheck(0.5, cfg.engine.gpu_memory_utilization)
        check.sleep(engine)                         # raises HealthError

    ``freed``: the bytes the last measured sleep freed (its pool's pages; ``phase_memory``'s
    ``asleep_pool``). The decision is agreed over the ranks (a collective where a device is read:
    every rank sleeps its engine at the same point)."""

    min_share: float = 0.5
    gpu_memory_utilization: float = 0.4
    reader: Callable[[], tuple[int, int] | None] | None = None
    freed: int = 0

    def sleep(self, engine: Any) -> None:
        read = self.reader or gpu_memory.device_memory
        first = read()
        if first is None:
            engine.sleep()
            return
        note_device_use(first[0])  # the phase's peak: engine and rollout both on the device
        release_cached()
        before, total = read() or first
        engine.sleep()
        after, _ = read() or first
        self.freed = max(before - after, 0)
        expected = planned_sleep_freed(self.gpu_memory_utilization, total)
        problem = sleep_freed_problem(before, after, expected, self.min_share)
        if any_rank([problem is not None])[0]:
            raise HealthError(problem or "vLLM's sleep freed too little on another rank")
