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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from common.launcher import RunStopped
from common.train.distributed import all_reduce_values

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


def any_rank(flags: Sequence[bool]) -> list[bool]:
    """Each flag true on any rank (an all-reduce of their max; the flags unchanged in one
    process): a decision every rank then takes alike. A collective: every rank calls it with
    the same number of flags."""
    return [v > 0 for v in all_reduce_values([float(bool(f)) for f in flags], "max")]


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
