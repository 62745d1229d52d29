"""CER as a reward function for ``trl.GRPOTrainer`` (written against TRL 1.16.0; extra ``[trl]``).

    reward = CERReward(tokenizer, "cer")  # or "rule+cer", "rule", "exact", "verifree"
    trainer = GRPOTrainer(model, reward_funcs=[reward], args=GRPOConfig(...), train_dataset=ds)
    reward.attach(trainer)  # the live policy scores; before train()
    trainer.train()

What TRL 1.16.0 hands a reward function (``GRPOTrainer._calculate_rewards``): ``prompts``,
``completions`` (decoded), ``completion_ids`` (the sampled token ids, up to and including the
end-of-sequence token), every dataset column but ``prompt`` as a list with one value per
completion, and ``trainer_state``, ``log_extra``, ``log_metric``. Each process calls it on its own
share of the generation batch; that batch is the ``RepeatSampler``'s order, in which the
``num_generations`` completions of a prompt are consecutive, and TRL normalises rewards over
blocks of ``num_generations`` of the batch gathered over the processes in rank order. A process's
share need not hold whole groups (``per_device_train_batch_size`` need not be a multiple of
``num_generations``); the prompt ids are not passed.

So ``CERReward`` scores whole groups per call: it re-tokenizes each group's prompt with the
trainer's own ``_tokenize_prompts`` (the ids TRL generated from), splits every completion at its
last box on the sampled ids (``cer.rewards.answer.solution_split``) and computes the rewards with
``cer.rewards.groups.group_rewards`` on ``cer.rewards.scoring.hf_prefix_scorer`` over the trainer's live
policy (eval mode while scoring, no grad) or over a frozen ``scorer_model``. Under several
processes (``torch.distributed`` initialised, world size > 1) the share sizes are gathered; when a
share does not start or end on a group boundary, the completions are gathered too and each process
scores every group its share touches, returning its own samples' rewards.

ZeRO-3: every forward of a partitioned model gathers its parameters collectively, so every rank
must make the same number of forwards even when ranks score different numbers of groups. Under
world size > 1 each rank makes the same number of scorer calls (``groups_per_call`` groups a call;
the count padded to the largest over the ranks with a ``torch.distributed.all_reduce`` (MAX),
padding calls scoring nothing), and each call runs ``hf_prefix_scorer(sync_ranks=True)``, which
pads its forwards the same way (one-token forwards). Tested on CPU only
(``tests/cer/test_cer_trl.py``): two TRL 1.16.0 GRPO steps in one process and in two (torchrun,
gloo, DDP; a group cut between the processes), and two ranks under the DeepSpeed launcher scoring
with a ZeRO-3 partitioned model outside TRL; not TRL under DeepSpeed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cer.data import MathExample
from cer.rewards.answer import response_split
from cer.rewards.expectation import SELECTIONS
from cer.rewards.groups import DEFAULT_RULES, SCORED_TYPES, Group, Rules, group_rewards
from cer.rewards.scoring import _max_over_ranks, hf_prefix_scorer
from common.rollout.trajectory import Trajectory

REWARD_TYPES = ("cer", "rule+cer", "rule", "exact", "verifree")
TRL_VERSION = "1.16.0"  # the version whose GRPOTrainer this module was written against and tested
# what TRL adds to a reward function's keyword arguments besides the dataset's columns
TRL_KWARGS = ("trainer_state", "log_extra", "log_metric", "environments")


def _world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather(obj: Any, world: int) -> list[Any]:
    """Every rank's ``obj``, in rank order (a collective under world size > 1)."""
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def prompt_token_ids(
    tokenizer: Any, prompts: Sequence[Any], chat_template_kwargs: dict | None = None
) -> list[list[int]]:
    """Prompt ids as TRL 1.16.0's ``GRPOTrainer._tokenize_prompts`` makes them for text prompts
    without tools: the chat template with the generation prompt for conversational prompts (lists
    of messages), the tokenizer's plain encoding for strings. Used without an attached trainer."""
    if not prompts:
        return []
    if isinstance(prompts[0], str):
        return [list(x) for x in tokenizer(text=list(prompts))["input_ids"]]
    out = tokenizer.apply_chat_template(
        conversation=list(prompts),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        **(chat_template_kwargs or {}),
    )
    return [list(x) for x in out["input_ids"]]


class CERReward:
    """A ``reward_funcs`` entry for ``trl.GRPOTrainer`` computing ``reward_type`` on whole groups.

    ``reward_type``: ``cer``, ``rule+cer`` (1 where the rule verifier accepts, else CER),
    ``verifree`` (pi(a* | own solution)), or the unscored ``rule`` and ``exact``
    (``cer.rewards.groups``). The reference answer is the dataset column ``answer_key``; the other
    columns are the example's metadata (``verifier: alias`` with ``answer_forms``, or
    ``multiple_choice``, select the rule verifier as in ``cer.data``).

    Scorer: ``scorer_model`` (a frozen model; it stays as given) or, without it, the attached
    trainer's live policy, which follows every update. ``num_generations``: the group size; by
    default the attached trainer's (``num_generations`` in training, ``num_generations_eval`` in
    evaluation). ``m``, ``selection``, ``rules``: as ``reward.m``, ``reward.m_selection`` and the
    verifiers of ``cer train``. ``batch_size``: rows per scoring forward; ``groups_per_call``:
    groups per scorer call (None: all of a call's groups at once). ``sync_ranks``: equal forward
    counts on every rank (None: whenever world size > 1; see the module docstring). ``name``: the
    name TRL logs the reward under (``rewards/<name>/mean``; default the reward type).
    """

    def __init__(
        self,
        tokenizer: Any = None,
        reward_type: str = "cer",
        *,
        scorer_model: torch.nn.Module | None = None,
        num_generations: int | None = None,
        m: int | None = None,
        selection: str = "per_answer",
        rules: Rules = DEFAULT_RULES,
        answer_key: str = "answer",
        batch_size: int = 16,
        groups_per_call: int | None = None,
        sync_ranks: bool | None = None,
        name: str | None = None,
    ) -> None:
        if reward_type not in REWARD_TYPES:
            raise ValueError(
                f"CERReward: reward_type must be one of {REWARD_TYPES}; got {reward_type!r}"
            )
        if selection not in SELECTIONS:
            raise ValueError(f"CERReward: selection must be one of {SELECTIONS}; got {selection!r}")
        for key, value in (
            ("num_generations", num_generations),
            ("m", m),
            ("groups_per_call", groups_per_call),
            ("batch_size", batch_size),
        ):
            if value is not None and value < 1:
                raise ValueError(f"CERReward: {key} must be at least 1; got {value}")
        self.tokenizer = tokenizer
        self.reward_type = reward_type
        self.scorer_model = scorer_model
        self.num_generations = num_generations
        self.m = m
        self.selection = selection
        self.rules = rules
        self.answer_key = answer_key
        self.batch_size = batch_size
        self.groups_per_call = groups_per_call
        self.sync_ranks = sync_ranks
        self.__name__ = name or reward_type  # TRL's get_callable_name reads it
        self.trainer: Any = None
        self.calls = 0  # scorer calls made (padding calls included): tests and diagnostics

    @property
    def scored(self) -> bool:
        """Whether the reward needs the model (CER and VeriFree), or only the verifiers."""
        return self.reward_type in SCORED_TYPES

    def attach(self, trainer: Any) -> CERReward:
        """Bind the built ``GRPOTrainer``: its policy scores (unless ``scorer_model``), its
        tokenizer and group size are the defaults, its ``_tokenize_prompts`` gives the prompt ids.
        Returns self."""
        missing = [
            a
            for a in ("model", "accelerator", "num_generations", "_tokenize_prompts")
            if not hasattr(trainer, a)
        ]
        if missing:
            raise TypeError(
                f"CERReward.attach: {type(trainer).__name__} lacks {missing}; it expects a "
                f"trl.GRPOTrainer (written against TRL {TRL_VERSION})"
            )
        if getattr(trainer, "environment_factories", None) is not None:
            raise ValueError(
                "CERReward.attach: a trainer with environment_factories (multi-turn environments) "
                "is not supported: CER scores single-turn completions"
            )
        if self.num_generations is not None and self.num_generations != trainer.num_generations:
            raise ValueError(
                f"CERReward.attach: num_generations={self.num_generations} was given, but the "
                f"trainer samples {trainer.num_generations} completions per prompt"
            )
        self.trainer = trainer
        if self.tokenizer is None:
            self.tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
        return self

    def group_size(self) -> int:
        """G of this call: the given ``num_generations``, else the trainer's (eval's in eval)."""
        if self.num_generations is not None:
            return self.num_generations
        if self.trainer is None:
            raise RuntimeError(
                f"CERReward({self.reward_type!r}): no group size: call reward.attach(trainer) "
                "after building the GRPOTrainer, or pass num_generations="
            )
        if self.trainer.model.training:
            return self.trainer.num_generations
        return getattr(self.trainer, "num_generations_eval", None) or self.trainer.num_generations

    def scorer_module(self) -> torch.nn.Module:
        """The model that scores: ``scorer_model``, else the attached trainer's policy."""
        if self.scorer_model is not None:
            return self.scorer_model
        if self.trainer is None:
            raise RuntimeError(
                f"CERReward({self.reward_type!r}): not attached: call reward.attach(trainer) "
                "after building the GRPOTrainer (its live policy scores), or pass scorer_model="
            )
        return self.trainer.accelerator.unwrap_model(self.trainer.model)

    def prompt_ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        """Token ids of ``prompts`` as the attached trainer tokenizes them for generation (else
        ``prompt_token_ids`` with this reward's tokenizer)."""
        if self.trainer is not None:
            ids = self.trainer._tokenize_prompts(list(prompts))[0]
            return [list(map(int, x)) for x in ids]
        return prompt_token_ids(self._tokenizer(), prompts)

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise RuntimeError(
                f"CERReward({self.reward_type!r}): no tokenizer: pass one, or attach(trainer)"
            )
        return self.tokenizer

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """One reward per completion of this process's share, in order (TRL's call)."""
        if completion_ids is None:
            raise ValueError(
                "CERReward: no completion_ids: CER scores the sampled token ids, which TRL's "
                f"GRPOTrainer passes as completion_ids (TRL {TRL_VERSION})"
            )
        n = len(completion_ids)
        if len(prompts) != n:
            raise ValueError(f"CERReward: {len(prompts)} prompts for {n} completion_ids")
        columns = {k: v for k, v in kwargs.items() if k not in TRL_KWARGS}
        if self.answer_key not in columns:
            raise ValueError(
                f"CERReward: no {self.answer_key!r} column (the reference answer) among the "
                f"dataset columns passed: {sorted(columns)}"
            )
        for key, values in columns.items():
            if not isinstance(values, (list, tuple)) or len(values) != n:
                raise ValueError(f"CERReward: column {key!r} has no value per completion")
        samples = [
            (prompts[i], list(map(int, completion_ids[i])), {k: v[i] for k, v in columns.items()})
            for i in range(n)
        ]
        if not self.scored:  # the verifiers need no group, no model and no other rank
            rewards, _ = self._rewards([[s] for s in samples], [[] for _ in samples])
            return rewards
        g = self.group_size()
        rank, world = _world()
        sizes = _all_gather(n, world)
        offset, total = sum(sizes[:rank]), sum(sizes)
        if total % g:
            where = f"the batch gathered over {world} ranks ({sizes})" if world > 1 else "the batch"
            raise ValueError(
                f"CERReward: {where} has {total} completions, not a multiple of the group size "
                f"{g} (num_generations): CER needs whole groups"
            )
        if world > 1 and any(sum(sizes[:r]) % g for r in range(world)):
            # a share starts or ends inside a group: every rank needs the others' completions
            everyone = [s for share in _all_gather(samples, world) for s in share]
            first, last = offset // g, math.ceil((offset + n) / g)
            blocks = [everyone[j * g : (j + 1) * g] for j in range(first, last)]
            start = offset - first * g
        else:
            blocks, start = [samples[j : j + g] for j in range(0, n, g)], 0
        for b, block in enumerate(blocks):
            if any(s[0] != block[0][0] for s in block):
                raise ValueError(
                    f"CERReward: the completions of group {b} of this call do not share one "
                    f"prompt: TRL lays out a batch as groups of num_generations={g} consecutive "
                    "completions of one prompt"
                )
        ids = self.prompt_ids([block[0][0] for block in blocks])
        rewards, stats = self._rewards(blocks, ids, world)
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if log_metric is not None:
            for key, value in stats.items():
                log_metric(key, value)
        return rewards[start : start + n]

    def _rewards(
        self, blocks: list[list[tuple]], prompt_ids: list[list[int]], world: int = 1
    ) -> tuple[list[float], dict[str, float]]:
        """``reward_type`` over the groups ``blocks`` (samples ``(prompt, ids, columns)``), in
        scorer calls of ``groups_per_call`` groups, padded to the ranks' largest call count."""
        tokenizer = self._tokenizer()
        groups = [
            self._group(block, ids, tokenizer)
            for block, ids in zip(blocks, prompt_ids, strict=True)
        ]
        per_call = self.groups_per_call or max(len(groups), 1)
        chunks = [groups[i : i + per_call] for i in range(0, len(groups), per_call)]
        score_fn, model, was_training = None, None, False
        sync = (world > 1) if self.sync_ranks is None else self.sync_ranks
        n_calls = len(chunks)
        if self.scored:
            model = self.scorer_module()
            was_training = model.training
            model.eval()  # no dropout while scoring; no gradient checkpointing (it drops caches)
            score_fn = hf_prefix_scorer(model, self.batch_size, sync_ranks=sync)
            if sync:
                n_calls = _max_over_ranks(n_calls)
        try:
            rewards: list[float] = []
            weighted: dict[str, float] = {}
            for chunk in chunks:
                out, stats = group_rewards(
                    [self.reward_type],
                    chunk,
                    score_fn,
                    tokenizer,
                    self.m,
                    self.selection,
                    self.rules,
                )
                rewards += out[self.reward_type].tolist()
                for key, value in stats.items():
                    weighted[key] = weighted.get(key, 0.0) + value * len(chunk)
                self.calls += score_fn is not None
            for _ in range(n_calls - len(chunks)):  # another rank scores more chunks
                score_fn([], [], [], [])
                self.calls += 1
        finally:
            if model is not None:
                model.train(was_training)
        return rewards, {k: v / len(groups) for k, v in weighted.items()}

    def _group(self, block: list[tuple], prompt_ids: list[int], tokenizer: Any) -> Group:
        """A ``cer.rewards.groups.Group`` of one prompt's completions (``(prompt, ids, columns)``)."""
        prompt, _, columns = block[0]
        metadata = {k: v for k, v in columns.items() if k != self.answer_key}
        answer = columns[self.answer_key]
        if answer is None:
            raise ValueError(f"CERReward: a row's {self.answer_key!r} is None")
        example = MathExample(str(columns.get("id", "")), str(prompt), str(answer), metadata)
        trajs, splits = [], []
        for k, (_, ids, _) in enumerate(block):
            trajs.append(
                Trajectory("trl", k, example.id, example.problem, [example.answer], prompt_ids, ids)
            )
            splits.append(response_split(ids, tokenizer, bool(metadata.get("short_answer"))))
        return Group(example, list(prompt_ids), trajs, splits)
