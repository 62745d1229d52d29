"""The parts of a policy-gradient step as plain typed callables, so that a trainer takes them
from its config instead of branching on a method:

    reward(groups, ctx) -> Rewards                          one reward per trajectory, its metrics
    step_scorer(groups, ctx) -> list[list[float]]           one score per agent step
    estimator(rewards, group_ids, step_scores) -> advantages   [N], or per token (lists)

A trainer with a step scorer puts ``step_layout(trajs)`` into the reward's extras, so that a
step-level estimator (``arco.advantages:DenseAdvantages``) can place its per-step advantages
on each step's tokens (``spread_to_tokens``).

``groups`` are a step's groups in batch order (``Group``: one question, its gold answers and
aliases, its n trajectories and their final answers); ``ctx`` (``RewardContext``) is what a
reward may need from the run, handed over explicitly: the policy for scoring, the tokenizer, the
engine, and a method's own inputs in ``extra`` (EviBack's teacher verdicts, CER's scorer).

Built-ins here: the rewards ``exact_match`` and ``f1`` (the search agent's), the estimators
``grpo`` and ``rloo`` (``common.rl``'s). A method package keeps its own instances (CER's family
in ``cer.rewards.groups``, EviBack's backoff in ``eviback.backoff``). A config names one by a
built-in name or an import path, ``reward.fn=package.module:Name`` (a class is instantiated,
with the keyword arguments of a ``*_args`` mapping where the config has one, e.g.
``reward.fn_args``, ``reward.step_scorer_args``); ``load_part`` resolves and checks it when the config is built. A user's
reward, in ``my_rewards.py`` on the path::

    import torch
    from common.rewards import Rewards

    def answered(groups, ctx):
        values = [float(p is not None) for g in groups for p in g.predictions]
        return Rewards(torch.tensor(values), {"answered": sum(values) / len(values)})

    # python -m common.search_grpo --config ... reward.fn=my_rewards:answered
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from common.metrics import exact_match as em_score
from common.metrics import f1_score
from common.rollout.trajectory import Trajectory

if TYPE_CHECKING:  # torch loads where a reward runs: the config modules import this one
    from torch import Tensor


@dataclass
class Group:
    """One question's sampled trajectories (``predictions[k]``: trajectory k's final answer,
    None without one). ``source``: the method's own record of the group, for its rewards
    (``cer.rewards.groups.Group``); None for the search agent."""

    question: str
    golden_answers: list[str]
    aliases: list[str]
    trajectories: list[Trajectory]
    predictions: list[str | None]
    source: Any = None


@dataclass
class RewardContext:
    """What a reward may need from the run: the policy (scoring), its tokenizer, the rollout
    engine, the step, the step's training questions by id (``examples``: a step scorer's
    evidence), and what a method adds, each a typed record of its own package: EviBack's
    teacher verdicts (``teacher``: ``eviback.backoff.TeacherVerdicts``) and CER's scorer
    (``scoring``: ``cer.rewards.groups.CERScoring``). A reward that needs one reads it with
    ``context_part``, which names the reward and the missing part."""

    policy: Any = None
    tokenizer: Any = None
    engine: Any = None
    step: int = 0
    examples: Mapping[str, Any] | None = None
    teacher: Any = None
    scoring: Any = None


def context_part(ctx: RewardContext, name: str, kind: type, who: str, default: Any = None) -> Any:
    """``ctx.<name>``, checked to be a ``kind`` (``default`` where the run gives none and the
    reward has one): a reward given a run that does not provide it (EviBack's backoff outside
    EviBack's trainer, say) fails in one line naming both."""
    part = getattr(ctx, name)
    if part is None and default is not None:
        return default
    if not isinstance(part, kind):
        got = "nothing" if part is None else type(part).__name__
        raise ValueError(
            f"{who} needs the reward context's {name} ({kind.__module__}.{kind.__name__}); "
            f"this run gives {got} (only the trainer that makes it can run this reward)"
        )
    return part


@dataclass
class Rewards:
    """A reward's output: ``values`` [N] (group after group), the metrics it counted (logged as
    they are), and per-sample extras an estimator or the trainer may read (EviBack's
    ``advantage_scale`` [N])."""

    values: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)


class OutcomeReward(Protocol):
    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards: ...


class StepScorer(Protocol):
    """One score per agent step. A scorer may also keep ``last_metrics`` (a mapping of floats:
    what its last call counted), which the trainers log as ``step_scorer/<name>``."""

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> list[list[float]]: ...


class AdvantageEstimator(Protocol):
    def __call__(
        self,
        rewards: Rewards,
        group_ids: Sequence[str],
        step_scores: list[list[float]] | None = None,
    ) -> Tensor | list[list[float]]: ...


def groups_of(trajs: Sequence[Trajectory]) -> list[Group]:
    """The search agent's trajectories (whole groups, each group's contiguous) as ``Group``s."""
    groups: list[Group] = []
    seen: set[str] = set()
    for t in trajs:
        if not groups or groups[-1].trajectories[0].group_id != t.group_id:
            if t.group_id in seen:
                raise ValueError(f"group {t.group_id!r} is not contiguous in the batch")
            seen.add(t.group_id)
            groups.append(Group(t.question, list(t.golden_answers), [], [], []))
        groups[-1].trajectories.append(t)
        groups[-1].predictions.append(t.answer)
    return groups


def _per_prediction(
    groups: Sequence[Group], score: Callable[[str | None, list[str]], float]
) -> Tensor:
    import torch

    return torch.tensor(
        [score(p, g.golden_answers + g.aliases) for g in groups for p in g.predictions]
    )  # [N]


def exact_match(groups: Sequence[Group], ctx: RewardContext) -> Rewards:
    """r = EM(answer, gold ∪ aliases) ∈ {0, 1} (SQuAD normalisation; 0 without an answer)."""
    return Rewards(_per_prediction(groups, em_score))


def f1(groups: Sequence[Group], ctx: RewardContext) -> Rewards:
    """r = max over gold ∪ aliases of token F1 = 2PR / (P + R) (0 without an answer)."""
    return Rewards(_per_prediction(groups, f1_score))


def grpo(
    rewards: Rewards, group_ids: Sequence[str], step_scores: list[list[float]] | None = None
) -> Tensor:
    """A_i = (r_i − mean_g) / (std_g + ε) (``common.rl.group_normalized_advantages``)."""
    from common.rl import group_normalized_advantages

    return group_normalized_advantages(rewards.values, group_ids)


def rloo(
    rewards: Rewards, group_ids: Sequence[str], step_scores: list[list[float]] | None = None
) -> Tensor:
    """A_i = r_i − 1/(n_g − 1) Σ_{j≠i} r_j (``common.rl.rloo_advantages``)."""
    from common.rl import rloo_advantages

    return rloo_advantages(rewards.values, group_ids)


def step_layout(trajs: Sequence[Trajectory]) -> dict[str, list]:
    """What a step-level estimator reads in ``Rewards.extras``, from a step's trajectories:
    ``step_kinds`` (per trajectory, each agent step's kind: search, answer, invalid),
    ``step_tokens`` (each step's ``[start, end)`` in the response ids: its sampled tokens) and
    ``response_tokens`` (each response's length)."""
    return {
        "step_kinds": [[s.kind for s in t.steps] for t in trajs],
        "step_tokens": [[(s.start, s.end) for s in t.steps] for t in trajs],
        "response_tokens": [len(t.response_ids) for t in trajs],
    }


def spread_to_tokens(
    per_step: Sequence[Sequence[float]],
    spans: Sequence[Sequence[tuple[int, int]]],
    lengths: Sequence[int],
) -> list[list[float]]:
    """One value per response token: step t's value on its sampled tokens ``spans[i][t]``, 0
    elsewhere (retrieved documents and a forced turn's text are not the policy's)."""
    if not len(per_step) == len(spans) == len(lengths):
        raise ValueError(
            f"spread_to_tokens: {len(per_step)} value lists, {len(spans)} span lists and "
            f"{len(lengths)} lengths"
        )
    out = []
    for i, (values, steps, n) in enumerate(zip(per_step, spans, lengths, strict=True)):
        if len(values) != len(steps):
            raise ValueError(
                f"spread_to_tokens: trajectory {i}: {len(values)} values for {len(steps)} steps"
            )
        row = [0.0] * n
        for v, (a, b) in zip(values, steps, strict=True):
            row[a:b] = [float(v)] * (b - a)
        out.append(row)
    return out


def check_step_scores(
    scores: Sequence[Sequence[float]], trajs: Sequence[Trajectory], name: str
) -> list[list[float]]:
    """A step scorer's output checked: one list per trajectory, one finite score per agent
    step; ``name`` (the config setting, ``key='value'``) begins the error."""
    if len(scores) != len(trajs):
        raise ValueError(f"{name} gave {len(scores)} score lists for {len(trajs)} trajectories")
    for i, (t, s) in enumerate(zip(trajs, scores, strict=True)):
        if len(s) != len(t.steps) or not all(math.isfinite(float(x)) for x in s):
            raise ValueError(
                f"{name}, trajectory {i}: {len(s)} scores for {len(t.steps)} "
                f"steps, or one not finite ({list(s)[:8]})"
            )
    return [[float(x) for x in s] for s in scores]


def step_scorer_metrics(scorer: Any) -> dict[str, float]:
    """``scorer.last_metrics`` (optional, see ``StepScorer``) as ``step_scorer/<name>``."""
    got = getattr(scorer, "last_metrics", None) or {}
    return {f"step_scorer/{k}": float(v) for k, v in got.items()}


REWARDS = {"exact_match": "common.rewards:exact_match", "f1": "common.rewards:f1"}
ESTIMATORS = {"grpo": "common.rewards:grpo", "rloo": "common.rewards:rloo"}
PROTOCOLS = {"reward": OutcomeReward, "step scorer": StepScorer, "estimator": AdvantageEstimator}


def import_object(module: str, name: str) -> Any:
    """``module``'s attribute ``name`` (dotted names walk into it): what ``package.module:Name``
    names. Raises what the import or the lookup raises."""
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def load_part(
    spec: str,
    key: str,
    kind: str,
    builtins: Mapping[str, str],
    args: Mapping[str, Any] | None = None,
) -> Any:
    """The callable ``spec`` names: a built-in name (``builtins``: name -> import path) or
    ``package.module:Name`` (a class is instantiated with ``args`` as keyword arguments, none
    when empty; ``args`` for anything but a class is an error). ``kind`` is a key of
    ``PROTOCOLS``; the callable must accept the protocol's positional parameters. Raises
    ``ValueError`` naming config key ``key`` when it does not import, cannot be built from
    ``args``, is not callable, or does not take them.

    A reward function written for TRL (a ``completions`` parameter) or verl (``solution_str``)
    is wrapped in its adapter (``ADAPTERS``, ``common.reward_adapters``; ``args`` are the
    adapter's), and a reward with a ``check_on_example()`` (the adapters) is called on one
    example now, before any model loads: what fails there is the error, naming ``key``."""
    path = builtins.get(spec, spec)
    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise ValueError(
            f"{key}={spec!r} is neither a built-in ({', '.join(builtins)}) nor package.module:Name"
        )
    try:
        obj: Any = import_object(module, name)
    except Exception as e:  # noqa: BLE001 - any failure to import is the user's to see
        raise ValueError(
            f"{key}={spec!r} does not import: {type(e).__name__}: {e}".splitlines()[0]
        ) from None
    args = dict(args or {})
    style = convention(obj) if kind == "reward" else None
    named = repr(spec)
    if style is not None:  # a TRL or verl function, unchanged, in its adapter (args: the adapter's)
        named = f"{spec!r} ({ADAPTERS[style][1]})"
        module, _, attr = ADAPTERS[style][0].partition(":")
        adapter = import_object(module, attr)
        try:
            inspect.signature(adapter).bind(obj, **args)
            obj = adapter(obj, **args)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"{key}={named} does not take the arguments {sorted(args)}: {e}"
            ) from None
        args = {}
    if inspect.isclass(obj):
        try:
            inspect.signature(obj).bind(**args)
        except TypeError as e:
            raise ValueError(
                f"{key}={spec!r} does not take the arguments {sorted(args)}: {e} "
                f"(it takes {_signature_text(obj)})"
            ) from None
        try:
            obj = obj(**args)
        except (ValueError, TypeError, FileNotFoundError) as e:
            raise ValueError(f"{key}={spec!r}: {e}") from None
    elif args:
        raise ValueError(
            f"{key}={spec!r} is not a class, so it takes no arguments (given {sorted(args)})"
        )
    if not callable(obj):
        raise ValueError(f"{key}={spec!r} is not callable ({type(obj).__name__})")
    wanted = [
        p
        for p in inspect.signature(PROTOCOLS[kind].__call__).parameters.values()
        if p.name != "self"
    ]
    call = f"({', '.join(p.name for p in wanted)})"
    try:
        signature = inspect.signature(obj)
        signature.bind(*(p.name for p in wanted))
    except (TypeError, ValueError):
        raise ValueError(
            f"{key}={spec!r} has the wrong signature: {_article(kind)} {kind} is called as "
            f"{call}, it takes {_signature_text(obj)}"
        ) from None
    check = getattr(obj, "check_on_example", None) if kind == "reward" else None
    if callable(check):  # one call on an example, before any model loads
        try:
            check()
        except ValueError as e:
            raise ValueError(f"{key}={named}: {e}") from None
    return obj


# A reward function written for TRL or verl, named directly as ``reward.fn``: its adapter (by
# import path, as every part; ``common.reward_adapters``) and what it is called in errors.
ADAPTERS = {
    "trl": ("common.reward_adapters:TRLReward", "a TRL reward function"),
    "verl": ("common.reward_adapters:VerlReward", "a verl compute_score"),
}


def convention(fn: Any) -> str | None:
    """``verl`` for a function with a ``solution_str`` parameter (verl's ``compute_score``s and
    Search-R1's), ``trl`` for one with ``completions`` (TRL's reward functions), else None (this
    project's ``(groups, ctx)``, or no signature to read). Classes are not inspected: a class
    named as ``reward.fn`` is built with ``reward.fn_args``."""
    if inspect.isclass(fn) or not callable(fn):
        return None
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    if "solution_str" in names:
        return "verl"
    if "completions" in names:
        return "trl"
    return None


@dataclass
class RewardConfig:
    """The outcome reward and the advantage estimator a run trains with, each a built-in name
    or ``package.module:Name``; resolved and checked when the config is built."""

    REWARDS: ClassVar[Mapping[str, str]] = REWARDS
    ESTIMATORS: ClassVar[Mapping[str, str]] = ESTIMATORS

    fn: str = field(
        default="exact_match",
        metadata={"help": "outcome reward: exact_match | f1 | package.module:Name"},
    )
    advantage: str = field(
        default="grpo", metadata={"help": "advantage estimator: grpo | rloo | package.module:Name"}
    )
    fn_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for a reward that is a class, e.g. reward.fn="
            "common.reward_adapters:TRLReward reward.fn_args.function=trl.rewards:accuracy_reward"
        },
    )

    def __post_init__(self) -> None:
        # an import path is resolved now, so a typo fails before any model loads; a built-in
        # name resolves when the trainer asks (tests/test_cli_fast.py: all do), so building
        # the defaults (a CLI's --help) imports no reward module and no torch
        if self.reward_name() not in self.REWARDS or self.fn_args:
            self.reward_fn()
        if self.advantage not in self.ESTIMATORS:
            self.estimator()

    def reward_name(self) -> str:
        """What names the outcome reward: ``fn`` (a method may fill an empty one, CER its
        ``type``)."""
        return self.fn

    def reward_fn(self) -> OutcomeReward:
        return load_part(self.reward_name(), "reward.fn", "reward", self.REWARDS, self.fn_args)

    def estimator(self) -> AdvantageEstimator:
        return load_part(self.advantage, "reward.advantage", "estimator", self.ESTIMATORS)


@dataclass
class StepScorerConfig:
    """A reward section's step scorer, one score per agent step (``StepScorer``), declared once
    for every method that takes one: ``reward.step_scorer`` (``package.module:Name``) and
    ``reward.step_scorer_args``. ``OWN`` is the value that names no scorer from outside: the
    method's own (the reference GRPO loop: empty, none; ARCO: ``rubric``, its μ). A subclass
    redeclares ``step_scorer`` to give its default and help, and calls ``__post_init__``."""

    OWN: ClassVar[str] = ""
    OWN_MEANS: ClassVar[str] = "empty"  # ``OWN`` in an error

    step_scorer: str = field(
        default="",
        metadata={
            "help": "one score per agent step, package.module:Name (e.g. "
            "experiments.step_scorers:TeacherEvidenceSteps, arco.step_scorer:RubricSteps); "
            "empty: none"
        },
    )
    step_scorer_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for a step scorer that is a class, e.g. "
            "reward.step_scorer_args.beta=0.3"
        },
    )

    def __post_init__(self) -> None:
        if self.external:  # an import path is resolved now: a typo fails before any model loads
            self.scorer()
        elif self.step_scorer_args:
            raise ValueError(
                f"reward.step_scorer_args is set but reward.step_scorer is {self.OWN_MEANS}"
            )

    @property
    def external(self) -> bool:
        """Whether ``step_scorer`` names a scorer (not the method's own, ``OWN``)."""
        return self.step_scorer != self.OWN

    def scorer(self) -> StepScorer | None:
        """The step scorer ``step_scorer`` names, built with ``step_scorer_args``; None for
        ``OWN``."""
        if not self.external:
            return None
        return load_part(
            self.step_scorer, "reward.step_scorer", "step scorer", {}, self.step_scorer_args
        )


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _signature_text(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "an unknown signature"
