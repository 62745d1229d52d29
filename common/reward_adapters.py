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
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from common.rewards import Group, RewardContext, Rewards, convention, import_object

if TYPE_CHECKING:  # torch loads where a reward runs, not when a config names one
    from torch import Tensor

__all__ = [
    "TRLReward",
    "VerlReward",
    "adapter_for",
    "convention",
    "from_trl",
    "from_verl",
    "response_texts",
]


# "Most of a batch": a call whose rewards are None (not applicable) for more than this share of
# its samples is warned about on stderr and counted (``trl/<name>/mostly_none_batches``).
MOSTLY_NONE_SHARE = 0.5
# What a function that is handed a value of the wrong shape raises (a string indexed as a dict,
# a message list read as a string): the errors that make ``auto`` try the other shape.
SHAPE_ERRORS = (TypeError, KeyError, IndexError, AttributeError)
# The example ``check_on_example`` scores before any model loads: a QA question, its gold answer,
# and two completions, a search agent's (think, answer) and one with two answer tags, a box and a
# GSM8K-style "####" line, so that the usual extractors find something to compare.
PROBE_QUESTION = "What is the capital of France?"
PROBE_GOLD = "Paris"
PROBE_COMPLETIONS = (
    "<think>The capital of France is Paris.</think>\n<answer>Paris</answer>",
    "<answer>Lyon</answer> is a city; the capital is Paris, so the answer is \\boxed{Paris}.\n"
    "#### Paris\n<answer>Paris</answer>",
)
# The keywords a TRL function is given besides the gold-answer columns (``solution_column``).
TRL_GIVEN = (
    "prompts",
    "completions",
    "completion_ids",
    "question",
    "golden_answers",
    "trainer_state",
    "log_metric",
    "log_extra",
)


class TRLReward:
    """A TRL reward function, ``fn(prompts, completions, **kwargs) -> list[float | None]``, as
    an outcome reward (the mapping: the module docstring).

    ``function``: the callable or its import path ``package.module:name``; with
    ``function_args`` it is a factory (TRL's ``get_cosine_scaled_reward``, ...) called with them
    to make the reward function. ``format``: ``standard`` (completions as strings),
    ``conversational`` (one assistant message each) or ``auto`` (strings, until a call raises a
    shape error (``SHAPE_ERRORS``) with them and succeeds with messages: from then on messages;
    ``check_on_example`` settles it before any model loads). ``prompt``: ``question`` (the
    group's) or ``decoded`` (the trajectory's prompt ids decoded: the templated prompt; strings
    only). ``solution_column``: the keyword(s) that carry the first gold answer (default
    ``solution`` and ``answer``, the columns of TRL's math and GSM8K examples).
    ``reward_kwargs``: constant keyword arguments added to every call
    (``reasoning_delimiters``). ``none_value``: the reward of a ``None``. ``name``: in metric
    names (default the function's ``__name__``). A function without ``**kwargs`` is given only
    the keywords it names."""

    def __init__(
        self,
        function: str | Callable[..., Any],
        *,
        function_args: Mapping[str, Any] | None = None,
        format: Literal["auto", "standard", "conversational"] = "auto",
        prompt: Literal["question", "decoded"] = "question",
        solution_column: str | Sequence[str] = ("solution", "answer"),
        reward_kwargs: Mapping[str, Any] | None = None,
        none_value: float = 0.0,
        name: str | None = None,
    ) -> None:
        if format not in ("auto", "standard", "conversational"):
            raise ValueError(
                f"format must be 'auto', 'standard' or 'conversational', got {format!r}"
            )
        if prompt not in ("question", "decoded"):
            raise ValueError(f"prompt must be 'question' or 'decoded', got {prompt!r}")
        if prompt == "decoded" and format == "conversational":
            raise ValueError(
                "prompt='decoded' is the templated prompt text, which is no conversation: "
                "use it with format='standard'"
            )
        columns = [solution_column] if isinstance(solution_column, str) else list(solution_column)
        for column in columns:
            if not isinstance(column, str) or not column.isidentifier():
                raise ValueError(f"solution_column must be a keyword name, got {column!r}")
            if column in TRL_GIVEN:
                raise ValueError(f"solution_column={column!r} is a keyword the function is given")
        if not math.isfinite(none_value):
            raise ValueError(f"none_value must be finite, got {none_value}")
        self.fn, self.label = _resolve(function, function_args)
        self.format, self.prompt, self.solution_columns = format, prompt, columns
        self.reward_kwargs = dict(reward_kwargs or {})
        self.none_value = float(none_value)
        self.name = name or _name_of(self.fn)
        self.accepts = _accepted(self.fn)
        self.mostly_none_batches = 0  # calls with most rewards None, since this object was made

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        import torch

        values: list[float] = []
        nones = 0
        logged: dict[str, list[float]] = defaultdict(list)
        state = _trainer_state(ctx.step)
        for i, g in enumerate(groups):
            where = f"{self.label} on {describe_group(g, i)}"
            texts = response_texts(g, ctx.tokenizer, where)
            prompt = self._prompt(g, ctx, where) if self.prompt == "decoded" else None
            for r in self._call(g, texts, prompt, state, logged, where):
                if r is None or (_is_number(r) and math.isnan(float(r))):
                    nones += 1
                    values.append(self.none_value)
                else:
                    values.append(_finite(r, where))
        share = nones / max(len(values), 1)
        metrics = {f"trl/{self.name}/none_share": share}
        if share > MOSTLY_NONE_SHARE:
            self.mostly_none_batches += 1
            self._warn_mostly_none(nones, len(values), ctx.step, groups)
        metrics[f"trl/{self.name}/mostly_none_batches"] = float(self.mostly_none_batches)
        metrics |= {f"trl/{self.name}/{k}": sum(v) / len(v) for k, v in logged.items()}
        return Rewards(_tensor(torch, values), metrics)

    def check_on_example(self) -> None:
        """One call on ``PROBE_*`` (no tokenizer, no model): the function runs with what it is
        given and returns one reward (a number or None) per completion; ``format=auto`` is
        settled by it. Raises ``ValueError`` saying what failed."""
        g = _probe_group()
        try:
            self._call(
                g, list(PROBE_COMPLETIONS), None, _trainer_state(0), defaultdict(list), self.label
            )
        except Exception as e:  # noqa: BLE001 - what failed is the message
            raise ValueError(_probe_failure(e, self.label)) from None

    def _call(
        self,
        g: Group,
        texts: list[str],
        prompt: str | None,
        state: Any,
        logged: dict[str, list[float]],
        where: str,
    ) -> list[Any]:
        """The function on one group: its rewards as it returned them, checked in number. With
        ``format=auto`` a shape error on strings makes it try messages once."""
        fmt = "standard" if self.format == "auto" else self.format
        try:
            return self._call_as(fmt, g, texts, prompt, state, logged, where)
        except SHAPE_ERRORS as e:
            if self.format != "auto" or prompt is not None or not _shape_error(e):
                raise
            try:
                got = self._call_as("conversational", g, texts, prompt, state, logged, where)
            except Exception as second:
                second.add_note(f"with strings for completions it raised {type(e).__name__}: {e}")
                raise second from None
            self.format = "conversational"  # settled: the function reads chat messages
            return got

    def _call_as(
        self,
        fmt: str,
        g: Group,
        texts: list[str],
        prompt: str | None,
        state: Any,
        logged: dict[str, list[float]],
        where: str,
    ) -> list[Any]:
        n = len(texts)
        gold = g.golden_answers[0] if g.golden_answers else None
        mine: dict[str, list[float]] = defaultdict(list)  # this call's log_metric values
        conversational = fmt == "conversational"
        question: Any = [{"role": "user", "content": g.question}] if conversational else g.question
        kwargs = {
            "prompts": [prompt if prompt is not None else question] * n,
            "completions": [[{"role": "assistant", "content": t}] for t in texts]
            if conversational
            else texts,
            "completion_ids": [list(t.response_ids) for t in g.trajectories],
            "question": [g.question] * n,
            "golden_answers": [list(g.golden_answers)] * n,
            **{column: [gold] * n for column in self.solution_columns},
            "trainer_state": state,
            "log_extra": _ignore,
            "log_metric": lambda key, value: mine[key].append(float(value)),
        }
        if self.accepts is not None:  # no **kwargs: what it names
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        got = _run(self.fn, {**kwargs, **self.reward_kwargs}, where, self._hint(fmt))
        out = _as_list(got, n, where)
        for key, v in mine.items():
            logged[key].extend(v)
        return out

    def _prompt(self, g: Group, ctx: RewardContext, where: str) -> str:
        """The trajectory's prompt ids decoded (``prompt=decoded``)."""
        if not g.trajectories:
            return ""
        return _decode(ctx.tokenizer, g.trajectories[0].prompt_ids, where, "prompt ids")

    def _hint(self, fmt: str) -> Callable[[Exception], str]:
        def hint(e: Exception) -> str:
            if isinstance(e, TypeError) and "argument" in str(e):
                given = [*TRL_GIVEN, *self.solution_columns, *self.reward_kwargs]
                return (
                    f"; it is given the keyword lists {', '.join(given)} (the first gold answer "
                    "under solution_column; constants: reward_kwargs)"
                )
            if self.format == "standard" and isinstance(e, SHAPE_ERRORS):
                return (
                    "; the completions were strings (format='standard'): a function that reads "
                    "completion[0]['content'], as trl.rewards' do, needs format='conversational' "
                    "(or 'auto')"
                )
            return ""

        return hint

    def _warn_mostly_none(self, nones: int, n: int, step: int, groups: Sequence[Group]) -> None:
        gold = next((g.golden_answers[0] for g in groups if g.golden_answers), None)
        print(
            f"[reward] {self.label}: {nones} of {n} rewards at step {step} were None (not "
            f"applicable), each scored {self.none_value:g}; {self.mostly_none_batches} such "
            f"batch(es) so far. The function found nothing it could judge: is the gold answer "
            f"it was given ({', '.join(self.solution_columns)}: e.g. {gold!r}) what it parses?",
            file=sys.stderr,
            flush=True,
        )


class VerlReward:
    """A verl ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw)
    -> float | dict`` as an outcome reward, called once per trajectory.

    ``function``: the callable or its import path (``function_args``: as ``TRLReward``'s).
    ``data_source``: passed as is (verl's ``default_compute_score`` picks its rule by it).
    ``ground_truth``: ``first`` (the first gold answer, a string: verl's gsm8k and math
    scorers), ``all`` (gold answers and aliases, a list), ``target`` (``{"target": [gold answers
    and aliases]}``: verl's and Search-R1's QA scorers) or ``auto`` (``first``, until a call
    raises a shape error with it and succeeds with ``target``: from then on ``target``;
    ``check_on_example`` settles it before any model loads). ``solution_str``: ``response`` (the
    response decoded, as verl's reward manager) or ``sequence`` (prompt + response decoded, as
    Search-R1's: its scorer skips the prompt's example answer). ``reward_kwargs``: verl's
    ``custom_reward_function.reward_kwargs``, added to every call. ``extra_info``: ``question``,
    ``golden_answers``, ``prediction`` (the trajectory's final answer), ``index`` (its sample
    index) and ``step``. A function that does not take ``data_source`` or ``extra_info`` (verl's
    own scorers, which ``default_compute_score`` calls with the other two) is called without
    them. A dict result's ``"score"`` is the reward; its other numeric values are averaged into
    ``verl/<name>/<key>``."""

    def __init__(
        self,
        function: str | Callable[..., Any],
        *,
        data_source: str = "",
        function_args: Mapping[str, Any] | None = None,
        ground_truth: Literal["auto", "first", "all", "target"] = "auto",
        solution_str: Literal["response", "sequence"] = "response",
        reward_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        if ground_truth not in ("auto", "first", "all", "target"):
            raise ValueError(
                f"ground_truth must be 'auto', 'first', 'all' or 'target', got {ground_truth!r}"
            )
        if solution_str not in ("response", "sequence"):
            raise ValueError(f"solution_str must be 'response' or 'sequence', got {solution_str!r}")
        self.fn, self.label = _resolve(function, function_args)
        self.data_source, self.ground_truth = data_source, ground_truth
        self.solution_str = solution_str
        self.reward_kwargs = dict(reward_kwargs or {})
        self.name = name or _name_of(self.fn)
        self.accepts = _accepted(self.fn)
        if self.accepts is not None:
            missing = {"solution_str", "ground_truth"} - self.accepts
            if missing:
                raise ValueError(
                    f"function {self.label} takes no {' or '.join(sorted(missing))}: not a verl "
                    f"compute_score (it takes {_signature_text(self.fn)})"
                )

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> Rewards:
        import torch

        values: list[float] = []
        sums: dict[str, list[float]] = defaultdict(list)
        for i, g in enumerate(groups):
            where = f"{self.label} on {describe_group(g, i)}"
            texts = response_texts(g, ctx.tokenizer, where)
            if self.solution_str == "sequence":
                texts = [
                    _decode(ctx.tokenizer, [*t.prompt_ids, *t.response_ids], where, "sequences")
                    for t in g.trajectories
                ]
            for k, (text, t) in enumerate(zip(texts, g.trajectories, strict=True)):
                at = f"{where}, trajectory {k}"
                info = {
                    "question": g.question,
                    "golden_answers": list(g.golden_answers),
                    "prediction": g.predictions[k],
                    "index": t.sample_index,
                    "step": ctx.step,
                }
                got = self._call(g, text, info, at)
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

    def check_on_example(self) -> None:
        """One call per completion of ``PROBE_*`` (no tokenizer, no model; ``sequence``: the
        question before each): each returns a finite number or a dict with one under "score";
        ``ground_truth=auto`` is settled by it. Raises ``ValueError`` saying what failed."""
        g = _probe_group()
        try:
            for k, text in enumerate(PROBE_COMPLETIONS):
                if self.solution_str == "sequence":
                    text = f"{PROBE_QUESTION}\n{text}"
                info = {
                    "question": g.question,
                    "golden_answers": list(g.golden_answers),
                    "prediction": PROBE_GOLD,
                    "index": k,
                    "step": 0,
                }
                got = self._call(g, text, info, self.label)
                if isinstance(got, Mapping):
                    if "score" not in got:
                        raise ValueError(
                            f"{self.label}: returned a dict without a 'score' key ({sorted(got)})"
                        )
                    got = got["score"]
                _finite(got, self.label)
        except Exception as e:  # noqa: BLE001 - what failed is the message
            raise ValueError(_probe_failure(e, self.label)) from None

    def _call(self, g: Group, text: str, info: dict[str, Any], at: str) -> Any:
        """The function on one trajectory; with ``ground_truth=auto`` a shape error on the gold
        string makes it try ``{"target": [...]}`` once."""
        shape = "first" if self.ground_truth == "auto" else self.ground_truth
        try:
            return self._call_as(shape, g, text, info, at)
        except SHAPE_ERRORS as e:
            if self.ground_truth != "auto" or not _shape_error(e):
                raise
            try:
                got = self._call_as("target", g, text, info, at)
            except Exception as second:
                e.add_note(
                    "with ground_truth={'target': [...]} it raised "
                    f"{type(second).__name__}: {second}"
                )
                raise e from None
            self.ground_truth = "target"  # settled: the function reads ground_truth["target"]
            return got

    def _call_as(self, shape: str, g: Group, text: str, info: dict[str, Any], at: str) -> Any:
        answers = list(g.golden_answers) + list(g.aliases)
        truth: Any = {
            "first": g.golden_answers[0] if g.golden_answers else None,
            "all": answers,
            "target": {"target": answers},
        }[shape]
        kwargs = {
            "data_source": self.data_source,
            "solution_str": text,
            "ground_truth": truth,
            "extra_info": info,
        }
        if self.accepts is not None:  # verl's own scorers: (solution_str, ground_truth, ...)
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        return _run(self.fn, {**kwargs, **self.reward_kwargs}, at)


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


def adapter_for(fn: Any, args: Mapping[str, Any] | None = None) -> TRLReward | VerlReward | None:
    """``fn`` (a function named directly as ``reward.fn``) in its adapter when it is written in
    TRL's or verl's form (``convention``), ``args`` (``reward.fn_args``) the adapter's keyword
    arguments; None for anything else. The adapter's own refusals (an unknown argument, a bad
    ``format``) raise ``TypeError`` or ``ValueError``."""
    style = convention(fn)
    if style is None:
        return None
    cls = {"trl": TRLReward, "verl": VerlReward}[style]
    inspect.signature(cls).bind(fn, **dict(args or {}))  # TypeError: an argument it does not take
    return cls(fn, **dict(args or {}))


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


def _accepted(fn: Callable[..., Any]) -> set[str] | None:
    """The keyword names ``fn`` takes; None when it takes ``**kwargs`` (everything) or its
    signature cannot be read."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}


def _shape_error(e: Exception) -> bool:
    """An error of a value read in the wrong shape, not a call with the wrong arguments."""
    return isinstance(e, SHAPE_ERRORS) and not (isinstance(e, TypeError) and "argument" in str(e))


def _probe_group() -> Group:
    """``PROBE_*`` as a group of two trajectories with no token ids (nothing is decoded)."""
    from common.rollout.trajectory import Trajectory

    trajs = [
        Trajectory("check", k, "check", PROBE_QUESTION, [PROBE_GOLD], [], response_ids=[])
        for k in range(len(PROBE_COMPLETIONS))
    ]
    return Group(PROBE_QUESTION, [PROBE_GOLD], [], trajs, [PROBE_GOLD] * len(trajs))


def _probe_failure(e: Exception, label: str) -> str:
    """What a call on the check's example did, on one line: the adapter's own refusal (a wrong
    number of rewards, a reward that is no number) or the function's error, with its notes."""
    example = (
        f"question {PROBE_QUESTION!r}, gold {PROBE_GOLD!r}, {len(PROBE_COMPLETIONS)} completions"
    )
    own = str(e)
    if isinstance(e, ValueError) and own.startswith(f"{label}: "):
        what = own.removeprefix(f"{label}: ")
    else:
        what = f"it raised {type(e).__name__}: {own}"
    for note in getattr(e, "__notes__", []):
        if note.startswith("raised by "):  # "raised by <label><hint>": the hint only
            note = note.removeprefix(f"raised by {label}").removeprefix("; ")
        if note:
            what += f" ({note})"
    return " ".join(f"called on one example ({example}) {what}".split())


def _signature_text(fn: Any) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "an unknown signature"


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
