"""Reward functions written for TRL or verl, used unchanged as this project's outcome rewards
(``common.rewards``: ``reward(groups, ctx) -> Rewards``).

    from trl.rewards import accuracy_reward
    from common.reward_adapters import from_trl, from_verl

    reward = from_trl(accuracy_reward, format="conversational")
    reward = from_verl(my_compute_score, data_source="openai/gsm8k")

From a config, by import path (a class, so ``reward.fn_args`` holds its keyword arguments)::

    reward.fn=common.reward_adapters:TRLReward
    reward.fn_args={function: "trl.rewards:accuracy_reward", format: conversational}

What a function sees, for group g and its trajectory k (docs/reward_adapters.md has the table):

- the response text: ``ctx.tokenizer.decode(response_ids, skip_special_tokens=True)``, as TRL and
  verl decode theirs (every response token: a search agent's inserted documents too);
- the gold answer: ``g.golden_answers[0]`` (TRL: the column ``solution_column``; verl:
  ``ground_truth``, or with ``ground_truth="all"`` the list of gold answers and aliases).

TRL (``TRLReward``) is called once per group, with keyword lists of one value per trajectory as
``GRPOTrainer`` passes them: ``prompts`` (the question, or the decoded prompt), ``completions``
(strings, or with ``format="conversational"`` one assistant message each: what TRL's own
``trl.rewards`` functions read), ``completion_ids``, the columns ``question``, ``golden_answers``
and ``solution_column``, and ``trainer_state`` (``global_step`` = ``ctx.step``), ``log_metric``
(logged as ``trl/<name>/<metric>``) and ``log_extra`` (ignored). A ``None`` reward (TRL's "not
applicable", NaN likewise) becomes ``none_value`` and is counted in ``trl/<name>/none_share``.

verl (``VerlReward``) is called once per trajectory, by keyword as verl's reward manager calls
``compute_score(data_source, solution_str, ground_truth, extra_info)`` plus ``reward_kwargs``; a
dict's ``"score"`` is the reward and its other numeric values are averaged into
``verl/<name>/<key>``.

A wrong number of rewards, or a reward that is not a finite number, is a ``ValueError`` naming the
function and the group; an exception from the function carries a note naming both.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from common.rewards import Group, RewardContext, Rewards, import_object

if TYPE_CHECKING:  # torch loads where a reward runs, not when a config names one
    from torch import Tensor

__all__ = ["TRLReward", "VerlReward", "from_trl", "from_verl", "response_texts"]


class TRLReward:
    """A TRL reward function, ``fn(prompts, completions, **kwargs) -> list[float | None]``, as
    an outcome reward (the mapping: the module docstring).

    ``function``: the callable or its import path ``package.module:name``; with
    ``function_args`` it is a factory (TRL's ``get_cosine_scaled_reward``, ...) called with them
    to make the reward function. ``format``: ``standard`` (completions as strings) or
    ``conversational`` (one assistant message each). ``prompt``: ``question`` (the group's) or
    ``decoded`` (the trajectory's prompt ids decoded: the templated prompt; standard only).
    ``solution_column``: the keyword that carries the first gold answer. ``reward_kwargs``:
    constant keyword arguments added to every call (``reasoning_delimiters``). ``none_value``:
    the reward of a ``None``. ``name``: in metric names (default the function's ``__name__``)."""

    def __init__(
        self,
        function: str | Callable[..., Any],
        *,
        function_args: Mapping[str, Any] | None = None,
        format: Literal["standard", "conversational"] = "standard",
        prompt: Literal["question", "decoded"] = "question",
        solution_column: str = "solution",
        reward_kwargs: Mapping[str, Any] | None = None,
        none_value: float = 0.0,
        name: str | None = None,
    ) -> None:
        if format not in ("standard", "conversational"):
            raise ValueError(f"format must be 'standard' or 'conversational', got {format!r}")
        if prompt not in ("question", "decoded"):
            raise ValueError(f"prompt must be 'question' or 'decoded', got {prompt!r}")
        if prompt == "decoded" and format == "conversational":
            raise ValueError(
                "prompt='decoded' is the templated prompt text, which is no conversation: "
                "use it with format='standard'"
            )
        if not solution_column.isidentifier():
            raise ValueError(f"solution_column must be a keyword name, got {solution_column!r}")
        if not math.isfinite(none_value):
            raise ValueError(f"none_value must be finite, got {none_value}")
        self.fn, self.label = _resolve(function, function_args)
        self.format, self.prompt, self.solution_column = format, prompt, solution_column
        self.reward_kwargs = dict(reward_kwargs or {})
        self.none_value = float(none_value)
        self.name = name or _name_of(self.fn)

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        import torch

        values: list[float] = []
        nones = 0
        logged: dict[str, list[float]] = defaultdict(list)
        state = _trainer_state(ctx.step)
        for i, g in enumerate(groups):
            where = f"{self.label} on {describe_group(g, i)}"
            texts = response_texts(g, ctx.tokenizer, where)
            n = len(texts)
            gold = g.golden_answers[0] if g.golden_answers else None
            kwargs = {
                "prompts": [self._prompt(g, ctx, where)] * n,
                "completions": texts
                if self.format == "standard"
                else [[{"role": "assistant", "content": t}] for t in texts],
                "completion_ids": [list(t.response_ids) for t in g.trajectories],
                "question": [g.question] * n,
                "golden_answers": [list(g.golden_answers)] * n,
                self.solution_column: [gold] * n,
                "trainer_state": state,
                "log_extra": _ignore,
                "log_metric": lambda key, value: logged[key].append(float(value)),
                **self.reward_kwargs,
            }
            got = _run(self.fn, kwargs, where, self._hint)
            for r in _as_list(got, n, where):
                if r is None or (_is_number(r) and math.isnan(float(r))):
                    nones += 1
                    values.append(self.none_value)
                else:
                    values.append(_finite(r, where))
        metrics = {f"trl/{self.name}/none_share": nones / max(len(values), 1)}
        metrics |= {f"trl/{self.name}/{k}": sum(v) / len(v) for k, v in logged.items()}
        return Rewards(_tensor(torch, values), metrics)

    def _prompt(self, g: Group, ctx: RewardContext, where: str) -> Any:
        if self.prompt == "decoded":
            if not g.trajectories:
                return ""
            return _decode(ctx.tokenizer, g.trajectories[0].prompt_ids, where, "prompt ids")
        if self.format == "conversational":
            return [{"role": "user", "content": g.question}]
        return g.question

    def _hint(self, e: Exception) -> str:
        if self.format == "standard" and isinstance(e, TypeError | KeyError | IndexError):
            return (
                "; the completions were strings (format='standard'): a function that reads "
                "completion[0]['content'], as trl.rewards' do, needs format='conversational'"
            )
        return ""


class VerlReward:
    """A verl ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)
    -> float | dict`` as an outcome reward, called once per trajectory.

    ``function``: the callable or its import path (``function_args``: as ``TRLReward``'s).
    ``data_source``: passed as is (verl's ``default_compute_score`` picks its rule by it).
    ``ground_truth``: ``first`` (the first gold answer, a string) or ``all`` (gold answers and
    aliases, a list). ``reward_kwargs``: verl's ``custom_reward_function.reward_kwargs``, added
    to every call. ``extra_info``: ``question``, ``golden_answers``, ``prediction`` (the
    trajectory's final answer), ``index`` (its sample index) and ``step``. A dict result's
    ``"score"`` is the reward; its other numeric values are averaged into ``verl/<name>/<key>``."""

    def __init__(
        self,
        function: str | Callable[..., Any],
        *,
        data_source: str = "",
        function_args: Mapping[str, Any] | None = None,
        ground_truth: Literal["first", "all"] = "first",
        reward_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        if ground_truth not in ("first", "all"):
            raise ValueError(f"ground_truth must be 'first' or 'all', got {ground_truth!r}")
        self.fn, self.label = _resolve(function, function_args)
        self.data_source, self.ground_truth = data_source, ground_truth
        self.reward_kwargs = dict(reward_kwargs or {})
        self.name = name or _name_of(self.fn)

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        import torch

        values: list[float] = []
        sums: dict[str, list[float]] = defaultdict(list)
        for i, g in enumerate(groups):
            where = f"{self.label} on {describe_group(g, i)}"
            texts = response_texts(g, ctx.tokenizer, where)
            truth: Any = (
                list(g.golden_answers) + list(g.aliases)
                if self.ground_truth == "all"
                else (g.golden_answers[0] if g.golden_answers else None)
            )
            for k, (text, t) in enumerate(zip(texts, g.trajectories, strict=True)):
                at = f"{where}, trajectory {k}"
                info = {
                    "question": g.question,
                    "golden_answers": list(g.golden_answers),
                    "prediction": g.predictions[k],
                    "index": t.sample_index,
                    "step": ctx.step,
                }
                kwargs = {
                    "data_source": self.data_source,
                    "solution_str": text,
                    "ground_truth": truth,
                    "extra_info": info,
                    **self.reward_kwargs,
                }
                got = _run(self.fn, kwargs, at)
                if isinstance(got, Mapping):
                    if "score" not in got:
                        raise ValueError(
                            f"{at}: returned a dict without a 'score' key (keys {sorted(got)})"
                        )
                    for key, v in got.items():
                        if key != "score" and _is_number(v):
                            sums[str(key)].append(float(v))
                    got = got["score"]
                values.append(_finite(got, at))
        metrics = {f"verl/{self.name}/{k}": sum(v) / len(v) for k, v in sums.items()}
        return Rewards(_tensor(torch, values), metrics)


def from_trl(fn: str | Callable[..., Any], **kwargs: Any) -> TRLReward:
    """``fn``, a TRL reward function (or its import path), as an outcome reward; ``kwargs``:
    ``TRLReward``'s (``format``, ``prompt``, ``solution_column``, ``reward_kwargs``, ...)."""
    return TRLReward(fn, **kwargs)


def from_verl(
    compute_score: str | Callable[..., Any], data_source: str = "", **kwargs: Any
) -> VerlReward:
    """``compute_score``, a verl scoring function (or its import path), as an outcome reward;
    ``kwargs``: ``VerlReward``'s (``ground_truth``, ``reward_kwargs``, ``name``)."""
    return VerlReward(compute_score, data_source=data_source, **kwargs)


def describe_group(g: Group, index: int) -> str:
    """``group 3 (q12: 'Who wrote ...')``: a group's place in the batch, question id and question."""
    qid = g.trajectories[0].question_id if g.trajectories else ""
    question = g.question if len(g.question) <= 60 else g.question[:57] + "..."
    return f"group {index} ({f'{qid}: ' if qid else ''}{question!r})"


def response_texts(g: Group, tokenizer: Any, where: str = "a reward") -> list[str]:
    """Each trajectory's response ids decoded, special tokens skipped (what TRL and verl pass).
    One per prediction: a group whose trajectories and predictions differ in number is refused."""
    if len(g.trajectories) != len(g.predictions):
        raise ValueError(
            f"{where}: {len(g.trajectories)} trajectories but {len(g.predictions)} predictions"
        )
    return [_decode(tokenizer, t.response_ids, where, "responses") for t in g.trajectories]


def _decode(tokenizer: Any, ids: Sequence[int], where: str, what: str) -> str:
    if tokenizer is None:
        raise ValueError(f"{where}: decoding the {what} needs ctx.tokenizer, and it is None")
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def _resolve(
    function: str | Callable[..., Any], factory_args: Mapping[str, Any] | None
) -> tuple[Callable[..., Any], str]:
    """The function (made by the factory when ``factory_args`` is given) and its label."""
    if isinstance(function, str):
        label = function
        module, sep, attr = function.partition(":")
        if not (sep and module and attr):
            raise ValueError(f"function={function!r} is not of the form package.module:name")
        try:
            obj: Any = import_object(module, attr)
        except Exception as e:  # noqa: BLE001 - any failure to import is the user's to see
            raise ValueError(
                f"function={function!r} does not import: {type(e).__name__}: {e}".splitlines()[0]
            ) from None
    else:
        obj = function
        label = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', _name_of(obj))}"
    if not callable(obj):
        raise ValueError(f"function {label} is not callable ({type(obj).__name__})")
    if factory_args is not None:
        try:
            obj = obj(**factory_args)
        except (TypeError, ValueError) as e:
            raise ValueError(f"function {label}({_kwargs_text(factory_args)}): {e}") from None
        label = f"{label}({_kwargs_text(factory_args)})"
        if not callable(obj):
            raise ValueError(f"function {label} made {type(obj).__name__}, not a callable")
    return obj, label


def _run(
    fn: Callable[..., Any],
    kwargs: dict[str, Any],
    where: str,
    hint: Callable[[Exception], str] = lambda e: "",
) -> Any:
    """``fn(**kwargs)`` (awaited when it is a coroutine, as TRL allows); an exception gets a note
    naming the function and the group."""
    try:
        got = fn(**kwargs)
        return asyncio.run(got) if inspect.isawaitable(got) else got
    except Exception as e:
        e.add_note(f"raised by {where}{hint(e)}")
        raise


def _as_list(got: Any, n: int, where: str) -> list[Any]:
    if isinstance(got, str | bytes | Mapping) or not hasattr(got, "__len__"):
        raise ValueError(
            f"{where}: returned {_show(got)}, not a list of one reward per completion ({n})"
        )
    if len(got) != n:
        raise ValueError(f"{where}: returned {len(got)} rewards for {n} completions")
    return list(got)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real)


def _finite(x: Any, where: str) -> float:
    if not _is_number(x) or not math.isfinite(float(x)):
        raise ValueError(f"{where}: returned {_show(x)} as a reward, not a finite number")
    return float(x)


def _tensor(torch: Any, values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float32)  # [N]


def _trainer_state(step: int) -> Any:
    """A ``transformers.TrainerState`` at ``step``, for functions that shape by progress."""
    try:
        from transformers import TrainerState
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    return TrainerState(global_step=step)


def _ignore(*args: Any, **kwargs: Any) -> None:
    """``log_extra``: there is no completions table to add columns to."""


def _name_of(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _show(x: Any) -> str:
    text = repr(x)
    return (
        f"{text[:60]}... ({type(x).__name__})" if len(text) > 60 else f"{text} ({type(x).__name__})"
    )
