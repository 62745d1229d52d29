"""One training engine for one CPU process, one GPU, or many GPUs under the DeepSpeed launcher.

World size 1 runs plain torch; a larger world runs DeepSpeed ZeRO. Both step the same way:
AdamW on the mean micro-batch loss of `grad_accum` micro-batches (averaged over ranks), the
gradient norm clipped to `max_grad_norm` (over all parameters, or per clip set: parameter groups
that name a ``"clip"`` set are clipped together, each set on its own), then one scheduler step.

A non-finite loss or gradient norm skips the optimizer step on every rank alike: the weights, the
optimizer state and the schedule stay as they were and the gradients are dropped
(``TrainEngine.step``; docs/run_folders.md, "Non-finite guards").

bf16: every weight in bf16 with fp32 master copies (full fine-tuning), or, for a model with a
``fp32_parameter(name)`` predicate (LoRA adapters and heads over a frozen base), the weights it
names in fp32 and the rest in bf16. Then every trained weight must be fp32: the optimizer steps
them directly, no master copies, and DeepSpeed runs its fp32 path (its bf16 path would cast them).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from common.train.config import SCHEDULERS, TrainConfig
from common.train.distributed import init_distributed
from common.train.lora import enable_adapter_grads, is_lora_model
from common.train.reference import ReferenceModel


def _adamw(params: list, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over a list of tensors, or of parameter groups (dicts with their own ``lr``...)."""
    return torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )


def clip_sets(groups: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Clip set name -> indices of the parameter groups in it; empty when no group names one
    (then the norm is clipped over all parameters together)."""
    sets: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        if "clip" in group:
            sets.setdefault(group["clip"], []).append(i)
    if sets and sum(map(len, sets.values())) != len(groups):
        raise ValueError("TrainEngine: name a clip set in every parameter group or in none")
    return sets


def _clip_per_set(
    optimizer: torch.optim.Optimizer,
    sets: dict[str, list[int]],
    max_norm: float,
    clip: bool = True,
) -> dict[str, float]:
    """Scale each clip set's gradients to norm <= ``max_norm`` (``clip``); the norm of each set,
    before."""
    norms = {}
    for name, indices in sets.items():
        params = [p for i in indices for p in optimizer.param_groups[i]["params"]]
        params = [p for p in params if p.grad is not None]
        if not params:
            norms[name] = 0.0
            continue
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if clip:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        norms[name] = float(norm)
    return norms


def _scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> Any:
    return transformers.get_scheduler(
        SCHEDULERS[config.scheduler],
        optimizer,
        num_warmup_steps=config.warmup_steps,
        num_training_steps=config.total_steps,
    )


def deepspeed_config(config: TrainConfig, bf16: bool, global_clip: bool = True) -> dict[str, Any]:
    """DeepSpeed's config for ``config``: ZeRO stage, bf16, accumulation and (``global_clip``)
    its own gradient clipping; also what a ZeRO-3 load partitions under (``load_for_training``).

    ``bf16``: the trained weights are bf16 (a full fine-tune; LoRA trains fp32 weights and runs
    DeepSpeed's fp32 path). Then the grad_accum micro-batches' gradients are summed in fp32, not
    in bf16 (EviBack accumulates 32 a step; DeepSpeed's default is the model dtype), which
    DeepSpeed 0.19.8 does as the setting says under ZeRO-2 and ZeRO-3 only (fp32 gradient
    partitions): at stage 0 it raises NotImplementedError at initialisation, at stage 1 it
    builds its BF16_Optimizer instead of ZeRO's (an unsharded fp32 gradient buffer, none of the
    ZeRO attributes the clip sets read). So bf16 below stage 2 is refused here (ValueError), and
    the step skip on a non-finite gradient norm is named (``check_grad_overflow``: ZeRO-2 skips
    such a bf16 step only with it, ZeRO-3 always; DeepSpeed's default is true today).
    """
    if bf16 and config.zero_stage < 2:
        raise ValueError(
            f"train.zero_stage={config.zero_stage} with train.bf16 (bf16 trained weights): "
            "DeepSpeed sums bf16 gradients in fp32 only under ZeRO-2 and ZeRO-3; set "
            "train.zero_stage to 2 or 3, or train.bf16 to false"
        )
    ds_config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,  # DeepSpeed's batch bookkeeping only
        "gradient_accumulation_steps": config.grad_accum,
        "gradient_clipping": config.max_grad_norm if global_clip else 0.0,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 2**31 - 1,
    }
    if bf16:
        ds_config["bf16"]["check_grad_overflow"] = True
        ds_config["data_types"] = {"grad_accum_dtype": "fp32"}
    return ds_config


def cast_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast ``model``'s floating-point parameters to ``dtype`` and leave its buffers as they are.

    ``model.to(dtype)`` casts buffers too: the rotary ``inv_freq`` in bf16 shifts RoPE angles by
    up to 2.4 rad at position 4096, so training, the KL reference and vLLM (which keeps them in
    fp32) would see different positions. DeepSpeed's own cast spares buffers for this reason.
    """
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block, its mode restored after: for the training model's
    forwards that are inference (scoring, rubric rows). The engine keeps it in training mode,
    where HF's gradient checkpointing drops the KV cache a forward is given and dropout is on."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


# HF attention modules' own dropout rate (a float applied when ``module.training``), by name
_ATTENTION_DROPOUT_ATTRS = ("attention_dropout", "dropout")


@contextlib.contextmanager
def dropout_off(model: nn.Module) -> Iterator[nn.Module]:
    """Every dropout of ``model`` off inside the block, its training mode kept: for a gradient
    forward that must be deterministic (μ's update forward, whose scores are the advantages').

    HF checkpoints a layer only when ``module.training``, so ``eval_mode`` would switch gradient
    checkpointing off too. Each ``nn.Dropout`` (LoRA's included) gets ``p = 0`` and each HF
    attention module's float rate (``attention_dropout``) 0, restored after: a rate, unlike a
    module's mode, survives a ``model.train()`` inside the block (a reference forward's
    ``eval_mode``), so a checkpointed layer recomputed in the backward is dropout-free too.
    ``torch.nn.functional.dropout`` with p = 0 returns its input and saves nothing."""
    rates: list[tuple[nn.Module, str, float]] = []
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            rates.append((module, "p", module.p))
            continue
        for attr in _ATTENTION_DROPOUT_ATTRS:
            value = module.__dict__.get(attr)
            if isinstance(value, float) and value > 0:
                rates.append((module, attr, value))
    for module, attr, _ in rates:
        setattr(module, attr, 0.0)
    try:
        yield model
    finally:
        for module, attr, value in rates:
            setattr(module, attr, value)


def is_partitioned(model: nn.Module) -> bool:
    """Whether ZeRO-3 holds ``model``'s parameters in partitions (``ds_id`` on them)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def load_for_training(path: str | Path, config: TrainConfig, partition: bool = True) -> nn.Module:
    """The causal LM at ``path`` loaded straight in the dtype training holds it in
    (``config.weights_dtype()``), so no rank holds an fp32 copy before the cast (an 8B model: 16
    GB of host memory in bf16, not 32; the values equal an fp32 load cast to bf16).

    Under ZeRO-3 on more than one rank (``config.zero_stage`` 3, a launcher's ``WORLD_SIZE``
    > 1) and with ``partition``, the weights are partitioned as they load (DeepSpeed's
    ``zero.Init`` through transformers' ``HfDeepSpeedConfig``): each rank holds its 1/world share
    from the start and never the whole model. Give ``partition=False`` where the caller copies
    the whole model before training (a full reference model for the KL, CER's frozen scorer)."""
    from transformers import AutoModelForCausalLM

    dtype = config.weights_dtype()
    world = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
    if not (partition and config.zero_stage == 3 and world > 1):
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    rank, _, _ = init_distributed()
    if rank == 0:
        print(f"[train] ZeRO-3: {path} partitioned over {world} ranks as it loads", flush=True)
    held = HfDeepSpeedConfig(deepspeed_config(config, dtype == torch.bfloat16))
    try:  # transformers partitions while HfDeepSpeedConfig lives; only this load, not later ones
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    finally:
        del held
        unset_hf_deepspeed_config()


def _accumulate_into(master: torch.Tensor):
    """A post-accumulate-grad hook: add the parameter's gradient to ``master.grad`` in fp32 and
    free the parameter's own."""

    def hook(param: torch.Tensor) -> None:
        grad = param.grad.float()
        master.grad = grad if master.grad is None else master.grad.add_(grad)
        param.grad = None

    return hook


class _PlainBackend:
    """World size 1: torch AdamW; with bf16 weights it steps fp32 master copies, as DeepSpeed does."""

    def __init__(
        self, model: nn.Module, groups: list[dict[str, Any]], config: TrainConfig, bf16: bool
    ):
        self.model = model
        self.params = [p for g in groups for p in g["params"]]
        self.masters = [p.detach().float().clone() for p in self.params] if bf16 else None
        if self.masters is not None:  # the same groups over the fp32 copies
            it = iter(self.masters)
            groups = [{**g, "params": [next(it) for _ in g["params"]]} for g in groups]
            # each micro-batch's bf16 gradient is added to its master's fp32 one as soon as it is
            # made, so the grad_accum micro-batches are summed in fp32 (as DeepSpeed's
            # grad_accum_dtype fp32), not in bf16
            for param, master in zip(self.params, self.masters, strict=True):
                param.register_post_accumulate_grad_hook(_accumulate_into(master))
        self.optimizer = _adamw(groups, config)
        self.scheduler = _scheduler(self.optimizer, config)
        self.config = config
        self.clip_sets = clip_sets(groups)
        self.set_norms: dict[str, float] = {}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.config.grad_accum).backward()

    def step(self, boundary: bool, skip: bool = False) -> tuple[float | None, bool]:
        """At a boundary: (the global gradient norm before clipping, whether the step was
        skipped: ``skip``, or a non-finite norm; then nothing but the gradients changes)."""
        if not boundary:
            return None, False
        trained = self.masters or self.params
        max_norm = self.config.max_grad_norm or math.inf
        norm = torch.nn.utils.get_total_norm([p.grad for p in trained if p.grad is not None])
        grad_norm = float(norm)
        if skip or not math.isfinite(grad_norm):
            if self.clip_sets:  # each set's norm, unclipped: which one went non-finite
                self.set_norms = _clip_per_set(self.optimizer, self.clip_sets, max_norm, False)
            self.optimizer.zero_grad(set_to_none=True)
            for param in self.params:
                param.grad = None
            return grad_norm, True
        if self.clip_sets:
            self.set_norms = _clip_per_set(self.optimizer, self.clip_sets, max_norm)
        else:
            torch.nn.utils.clip_grads_with_norm_(trained, max_norm, norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not None:
            with torch.no_grad():
                for master, param in zip(self.masters, self.params, strict=True):
                    param.copy_(master)
                    param.grad = None
        return grad_norm, False

    def save_state(self, folder: Path) -> None:
        names = {id(p): n for n, p in self.model.named_parameters()}
        state = {
            "params": {names[id(p)]: p.detach() for p in self.params},
            "masters": self.masters,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        from common.train.plain_state import save_plain

        save_plain(folder / "train_state", state)  # JSON + safetensors: reading runs no code

    def load_state(self, folder: Path) -> None:
        from common.train.plain_state import exists, load_legacy_torch, load_plain

        file = folder / "train_state.json"
        if exists(folder / "train_state"):
            state = load_plain(folder / "train_state")
        elif (folder / "train_state.pt").exists():  # an older checkpoint: weights_only
            file = folder / "train_state.pt"
            state = load_legacy_torch(file, "optimizer state")
        else:
            raise ValueError(f"{folder}: no train_state.json (checkpoint of a DeepSpeed run?)")
        names = {id(p): n for n, p in self.model.named_parameters()}
        expected = {names[id(p)] for p in self.params}
        if set(state["params"]) != expected:
            missing, extra = expected - set(state["params"]), set(state["params"]) - expected
            raise ValueError(
                f"{file}: trainable parameters differ: missing {missing}, extra {extra}"
            )
        with torch.no_grad():
            for param in self.params:
                param.copy_(state["params"][names[id(param)]])
            for master, saved in zip(self.masters or [], state["masters"] or [], strict=True):
                master.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class _DeepSpeedBackend:
    """World size > 1: DeepSpeed ZeRO with the same AdamW and schedule as the plain path."""

    def __init__(
        self, model: nn.Module, groups: list[dict[str, Any]], config: TrainConfig, bf16: bool
    ):
        import deepspeed

        self.clip_sets = clip_sets(groups)
        self.set_norms: dict[str, float] = {}
        if self.clip_sets and config.zero_stage not in (1, 2):
            raise ValueError("TrainEngine: per-set gradient clipping needs ZeRO stage 1 or 2")
        # per clip set: DeepSpeed's global clip off, each set clipped before AdamW's step
        ds_config = deepspeed_config(config, bf16, global_clip=not self.clip_sets)
        self.config = config
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model,
            model_parameters=groups,
            optimizer=lambda ps: _adamw(list(ps), config),
            lr_scheduler=lambda optimizer: _scheduler(optimizer, config),
            config=ds_config,
        )
        # LoRA: the frozen base need not be saved, and then cannot be loaded strictly.
        self.frozen = any(not p.requires_grad for p in model.parameters())
        # ZeRO's optimizers skip a step whose global gradient norm is not finite, on every rank,
        # and leave the schedule as it was (``overflow``; with bf16 ZeRO-2 through the config's
        # check_grad_overflow); under ZeRO stage 0 (fp32 only: ``deepspeed_config``) DeepSpeed
        # steps torch's AdamW as it is, and ``step`` skips it itself.
        self.skips_itself = hasattr(self.optimizer, "overflow")
        self.params = [p for g in groups for p in g["params"]]
        if self.clip_sets:
            self._scale: dict[str, float] = {}
            self.engine.basic_optimizer.register_step_pre_hook(self._clip_hook)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def _set_norms(self) -> dict[str, float]:
        """Each clip set's gradient norm over all ranks, from ZeRO's reduced gradient partitions
        (ZeRO-1/2 step AdamW one group at a time, so the norms must be known before its step)."""
        zero = self.engine.optimizer
        squares = {}
        for name, indices in self.clip_sets.items():
            norms = [
                float(
                    zero.get_grad_norm_direct(
                        zero.averaged_gradients[i], zero.params_in_partition[i]
                    )
                )
                for i in indices
            ]
            # DeepSpeed reports a NaN or inf group norm as -1
            bad = any(n < 0 or not math.isfinite(n) for n in norms)
            squares[name] = math.nan if bad else math.sqrt(sum(n * n for n in norms))
        return squares

    def _clip_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Before AdamW steps a group's fp32 partition: scale its gradient by its set's factor."""
        for group in optimizer.param_groups:
            scale = self._scale.get(group["clip"], 1.0)
            if scale < 1.0:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(scale)

    def step(self, boundary: bool, skip: bool = False) -> tuple[float | None, bool]:
        """DeepSpeed's step; at a boundary (its global gradient norm, whether the step was
        skipped). ZeRO skips a non-finite norm itself (a non-finite loss's backward made its
        gradients NaN: ``TrainEngine.backward``); ``skip`` forces it only where DeepSpeed steps
        torch's AdamW as it is (ZeRO stage 0 in fp32)."""
        forced = boundary and not self.skips_itself and self._nonfinite_stage0(skip)
        if boundary and self.clip_sets:
            self.set_norms = self._set_norms()
            max_norm = self.config.max_grad_norm or math.inf
            self._scale = {k: max_norm / (n + 1e-6) for k, n in self.set_norms.items()}
        if forced:
            self._step_without_update()
        else:
            self.engine.step()
        if not boundary:
            return None, False
        raw = self.engine.get_global_grad_norm()
        grad_norm = float(raw) if raw is not None else math.nan
        applied = not forced and self.engine.was_step_applied()
        if applied and raw is not None and not math.isfinite(grad_norm):
            import deepspeed

            raise RuntimeError(  # the weights are lost: a DeepSpeed that steps on a NaN norm
                f"TrainEngine: DeepSpeed {deepspeed.__version__} applied an optimizer step with "
                f"gradient norm {grad_norm} (0.19 skips such a step); the weights are not finite"
            )
        return grad_norm, not applied

    def _nonfinite_stage0(self, skip: bool) -> bool:
        """ZeRO stage 0: ``skip``, or a non-finite gradient, on any rank."""
        from common.train.distributed import any_rank

        bad = skip or any(
            p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in self.params
        )
        return any_rank([bad])[0]

    def _step_without_update(self) -> None:
        """DeepSpeed's step (its counters, its gradients dropped) with torch's AdamW not stepped
        and the schedule put back: the weights and the optimizer state stay as they were."""
        optimizer = self.engine.optimizer
        schedule = self.scheduler.state_dict()
        lrs = [g["lr"] for g in optimizer.param_groups]
        optimizer.step = lambda *args, **kwargs: None  # this call only
        try:
            self.engine.step()
        finally:
            del optimizer.step
        self.scheduler.load_state_dict(schedule)
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr

    def save_state(self, folder: Path) -> None:
        self.engine.save_checkpoint(
            str(folder), tag="deepspeed", save_latest=False, exclude_frozen_parameters=self.frozen
        )

    def load_state(self, folder: Path) -> None:
        weights_only_loads(self.engine)
        path, _ = self.engine.load_checkpoint(
            str(folder), tag="deepspeed", load_module_strict=not self.frozen
        )
        if path is None:
            raise ValueError(f"{folder}: no DeepSpeed state (checkpoint of a single-process run?)")


OPTIMIZER_SETTINGS = "optimizer_settings.json"  # in a checkpoint's state/: TrainEngine.save_state


def optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: Any) -> list[dict[str, Any]]:
    """Each parameter group's name, base lr (the schedule's ``base_lrs``), weight decay, betas
    and eps, as plain JSON values."""
    return [
        {
            "name": g.get("name", str(i)),
            "lr": float(scheduler.base_lrs[i]),
            "weight_decay": float(g["weight_decay"]),
            "betas": [float(b) for b in g["betas"]],
            "eps": float(g["eps"]),
        }
        for i, g in enumerate(optimizer.param_groups)
    ]


def weights_only_loads(ds_engine: Any) -> None:
    """DeepSpeed's checkpoint reads (its model-state and ZeRO optimizer-state files, through
    ``ds_engine.checkpoint_engine.load``) with ``torch.load(weights_only=True)``: torch's
    restricted unpickler, which builds tensors, plain containers and the few DeepSpeed and
    Python classes a ZeRO checkpoint holds (``DEEPSPEED_SAFE_GLOBALS``), and refuses a pickle
    naming anything else in one line instead of running it. DeepSpeed 0.19.8's own
    ``TorchCheckpointEngine.load`` passes ``weights_only=False``."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine,
    )

    engine = ds_engine.checkpoint_engine
    if type(engine) is not TorchCheckpointEngine:
        raise ValueError(
            f"DeepSpeed's checkpoint engine is {type(engine).__name__}; only its "
            "TorchCheckpointEngine is read with weights_only=True here"
        )

    def load(path: str, map_location: Any = None) -> Any:
        from common.train.plain_state import PlainStateError

        try:
            with torch.serialization.safe_globals(deepspeed_safe_globals()):
                return torch.load(path, map_location=map_location, weights_only=True)
        except Exception as err:  # UnpicklingError and what a refused global raises
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise PlainStateError(
                f"{path}: refused: not plain DeepSpeed state (a pickle naming code that "
                f"loading would run; torch's weights_only loader says: {first[:200]}); it "
                "was not loaded"
            ) from None

    engine.load = load


def deepspeed_safe_globals() -> list[Any]:
    """The classes a DeepSpeed 0.19.8 ZeRO checkpoint pickles besides tensors and containers
    (``torch.serialization.get_unsafe_globals_in_checkpoint`` on its ZeRO-2 and ZeRO-3 shards):
    the stage enum, the fragment-address named tuple and the loss scaler, plain records that
    run no code when built (no ``__reduce__`` or ``__setstate__`` of their own)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, fragment_address, LossScaler, DynamicLossScaler]


class TrainEngine:
    """Model + AdamW + LR schedule, driven the same way on every path.

        out = engine(input_ids=ids, attention_mask=mask)   # training forward
        engine.backward(loss)                              # one micro-batch
        info = engine.step()                               # optimizer step every grad_accum calls

    Training forwards go through `engine(...)`: DeepSpeed hooks its bookkeeping into its own
    forward, and ZeRO-3 computes wrong gradients without it (measured), so a forward of
    `engine.model` with gradients enabled is an error on every path. `engine.model` is the bare
    module (a PeftModel for LoRA) for generation, scoring under no_grad, and adapter switching.
    """

    def __init__(
        self,
        model: nn.Module,
        config: TrainConfig,
        *,
        reference: bool = False,
        param_groups: list[dict[str, Any]] | None = None,
    ):
        """``param_groups`` (optional): AdamW parameter groups, each ``{"name", "params", "lr",
        ...}``, covering exactly the trainable parameters (e.g. ARCO's policy adapter, rubric
        adapter and scoring head at their own rates); default: one group at ``config.lr``."""
        self.config = config
        self.rank, self.world_size, local_rank = init_distributed()
        cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        self.bf16 = config.use_bf16(self.device)
        self.global_step = 0
        self._micro_steps = 0
        self._losses_finite: torch.Tensor | None = None  # this window's losses all finite
        self.skipped_updates = 0  # optimizer updates skipped for non-finite values, this start
        self._skips: list[list[str]] = []  # each skipped update's reasons, until take_skips
        transformers.set_seed(config.seed)
        # from_pretrained returns eval mode, and HF checkpoints a layer only in training mode:
        # without this, gradient checkpointing is silently off (and dropout, where a model has it)
        model.train()
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if is_partitioned(model):  # loaded under ZeRO-3 (load_for_training): placed and cast
            if self.world_size == 1 or config.zero_stage != 3:
                raise ValueError(
                    "TrainEngine: the model was partitioned by ZeRO-3 at load; train it under "
                    f"ZeRO-3 on the same ranks (zero_stage={config.zero_stage}, "
                    f"world size {self.world_size})"
                )
        else:
            keep_fp32 = getattr(model, "fp32_parameter", None) if self.bf16 else None
            kept = {n: p.data for n, p in model.named_parameters() if keep_fp32 and keep_fp32(n)}
            model.to(self.device)
            cast_parameters(model, torch.bfloat16 if self.bf16 else torch.float32)
            for name, p in model.named_parameters():
                if name in kept:  # from the weights as given: a bf16 round trip would round them
                    p.data = kept[name].to(self.device, torch.float32)
        # Before DeepSpeed: a ZeRO-3 model can no longer be copied whole.
        self.reference = ReferenceModel(model) if reference else None
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("TrainEngine: the model has no parameter with requires_grad=True")
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError(
                f"TrainEngine: trained parameters in {sorted(map(str, dtypes))}; one dtype only "
                "(a model's fp32_parameter must name every trained weight)"
            )
        # bf16 masters and DeepSpeed's bf16 path only where the trained weights themselves are bf16
        trained_bf16 = dtypes == {torch.bfloat16}
        groups = param_groups or [{"name": "all", "params": params}]
        grouped = [p for g in groups for p in g["params"]]
        if len(grouped) != len(params) or {id(p) for p in grouped} != {id(p) for p in params}:
            raise ValueError(
                "TrainEngine: param_groups must hold each trainable parameter exactly once"
            )
        backend = _DeepSpeedBackend if self.world_size > 1 else _PlainBackend
        self._backend = backend(model, groups, config, trained_bf16)
        self._configured = optimizer_settings(self.optimizer, self._backend.scheduler)
        self._model = model
        self._in_engine_forward = False
        model.register_forward_pre_hook(self._refuse_outside_forward)

    @property
    def model(self) -> nn.Module:
        """The unwrapped module (the PeftModel for LoRA models)."""
        return self._model

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """AdamW (wrapped by DeepSpeed under DeepSpeed; over fp32 master copies with bf16)."""
        return self._backend.optimizer

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return self.optimizer.param_groups[0]["lr"]

    def set_group_lr(self, name: str, lr: float) -> None:
        """Set the base learning rate of parameter group ``name`` (the schedule scales it)."""
        groups = self.optimizer.param_groups
        index = [i for i, g in enumerate(groups) if g.get("name") == name]
        if not index:
            raise ValueError(
                f"set_group_lr: no group {name!r}; have {[g.get('name') for g in groups]}"
            )
        scheduler = self._backend.scheduler
        factor = (
            groups[index[0]]["lr"] / scheduler.base_lrs[index[0]]
            if scheduler.base_lrs[index[0]]
            else 1.0
        )
        scheduler.base_lrs[index[0]] = lr
        groups[index[0]]["initial_lr"] = lr
        groups[index[0]]["lr"] = lr * factor

    @property
    def pending_micro_batches(self) -> int:
        """Micro-batches whose gradient waits for the next optimizer step."""
        return self._micro_steps % self.config.grad_accum

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The training forward of the model."""
        self._in_engine_forward = True
        try:
            return self._backend.forward(*args, **kwargs)
        finally:
            self._in_engine_forward = False

    def _refuse_outside_forward(self, module: nn.Module, args: tuple) -> None:
        if torch.is_grad_enabled() and not self._in_engine_forward:
            raise RuntimeError(
                "TrainEngine: run training forwards as engine(...), not engine.model(...) "
                "(DeepSpeed needs its own forward); wrap inference in torch.no_grad()"
            )

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of loss / grad_accum.

        A non-finite loss is remembered for the step, and its backward is made NaN (the loss
        times NaN; a finite one times 1, exactly), so every gradient it reaches is NaN, on this
        rank and, through ZeRO's reduction, in every rank's partition: the step's global norm
        is NaN and every rank skips it (``step``). No host sync here."""
        finite = torch.isfinite(loss.detach()).all()
        self._losses_finite = (
            finite if self._losses_finite is None else self._losses_finite & finite
        )
        factor = torch.where(finite, 1.0, math.nan).to(loss.dtype)
        self._backend.backward(loss * factor)

    def step(self) -> dict[str, Any]:
        """End one micro-batch; at every grad_accum-th call clip, step AdamW and the schedule.

        Returns grad_norm (the global norm before clipping; None between boundaries), lr (the
        rate of this step), stepped, skipped and nonfinite, and with clip sets
        ``grad_norm/<set>`` (each set's norm before clipping) at a boundary.

        A boundary whose loss (any micro-batch's, on any rank) or global gradient norm is not
        finite is skipped on every rank: no optimizer or scheduler step, the gradients dropped,
        ``skipped`` true and ``nonfinite`` naming the cause (``["loss"]`` or ``["grad_norm"]``);
        it counts in ``global_step`` (a boundary) and ``skipped_updates``, and ``take_skips``
        hands its reasons to the run frame (``common.guards.NonFiniteGuard``).
        """
        lr = self.lr
        self._micro_steps += 1
        stepped = self.pending_micro_batches == 0
        bad_loss = False
        if stepped:
            bad_loss = self._losses_finite is not None and not bool(self._losses_finite)
            self._losses_finite = None
        grad_norm, skipped = self._backend.step(stepped, bad_loss)
        self.global_step += stepped
        info = {
            "grad_norm": grad_norm,
            "lr": lr,
            "stepped": stepped,
            "skipped": False,
            "nonfinite": [],
        }
        if stepped:
            info |= {f"grad_norm/{k}": v for k, v in self._backend.set_norms.items()}
            info |= self._agree_on_skip(bad_loss, skipped)
        return info

    def _agree_on_skip(self, bad_loss: bool, skipped: bool) -> dict[str, Any]:
        """The boundary's skip, checked to be every rank's (DeepSpeed decides it from the global
        norm, so it is), with its cause: a non-finite loss on any rank, else the norm."""
        from common.train.distributed import any_rank

        any_bad_loss, any_skipped = any_rank([bad_loss, skipped])
        if any_skipped != skipped:
            raise RuntimeError(
                f"TrainEngine: rank {self.rank} {'skipped' if skipped else 'applied'} the "
                "optimizer step another rank did not; the ranks' weights would differ"
            )
        if not skipped:
            return {}
        reasons = ["loss"] if any_bad_loss else ["grad_norm"]
        self.skipped_updates += 1
        self._skips.append(reasons)
        return {"skipped": True, "nonfinite": reasons}

    def skip_update(self, reasons: list[str]) -> None:
        """Record an update skipped before its first micro-batch (``policy_update`` found its
        rewards or advantages non-finite on some rank): nothing of the model, the optimizer or
        the schedule changes; ``take_skips`` reports it as a skipped boundary's."""
        if self.pending_micro_batches:
            raise ValueError(
                f"skip_update: {self.pending_micro_batches} micro-batches already accumulated"
            )
        self.skipped_updates += 1
        self._skips.append(list(reasons))

    def take_skips(self) -> list[list[str]]:
        """The reasons of each update skipped since the last call (the run frame's, per step)."""
        skips, self._skips = self._skips, []
        return skips

    def set_adapter(self, name: str) -> None:
        """Route forwards through LoRA adapter `name`; every adapter stays trainable."""
        if not is_lora_model(self.model):
            raise ValueError(f"set_adapter({name!r}): the model has no LoRA adapters")
        if name not in self.model.peft_config:
            raise ValueError(
                f"set_adapter: no adapter {name!r}; have {sorted(self.model.peft_config)}"
            )
        self.model.set_adapter(name)
        enable_adapter_grads(self.model)  # peft froze the others; ZeRO needs a fixed trainable set

    def save_state(self, folder: Path) -> None:
        """Optimizer, schedule and trainable weights into `folder`; all ranks must call, with no
        micro-batch pending (accumulated gradients are not saved). Also ``optimizer_settings.json``:
        each parameter group's configured lr, weight decay, betas and eps (what this engine was
        built with), which ``load_state`` compares with its own."""
        import json

        self._backend.save_state(folder)
        if self.is_main:
            record = {"configured": self._configured_settings()}
            (folder / OPTIMIZER_SETTINGS).write_text(json.dumps(record, indent=1))

    def load_state(self, folder: Path) -> None:
        """Inverse of save_state; all ranks must call. The global step is set by the caller.

        The optimizer's saved state holds the lr, weight decay, betas and eps it ran with; where
        this engine was built with others (a resume with ``allow_config_change``: ``train.lr``,
        ``train.weight_decay``, a method's group rates), its own are applied after the load to
        each group that differs: the weight decay, betas and eps as they are, the lr as the
        schedule's new base (``scheduler.base_lrs``, ``initial_lr``) with the group's current
        rate scaled to it (the schedule's factor kept), and one line printed. A checkpoint
        without ``optimizer_settings.json`` (older) gets its weight decay, betas and eps only."""
        import json

        configured = self._configured_settings()
        self._backend.load_state(folder)
        self._micro_steps = 0
        try:
            saved = json.loads((folder / OPTIMIZER_SETTINGS).read_text())["configured"]
        except (OSError, ValueError, KeyError, TypeError):
            saved = None
        changes = self._apply_settings(configured, saved)
        self.settings_changed = changes
        if changes and self.is_main:
            print(
                "[train] resumed under other optimizer settings, applied after loading its "
                f"state: {'; '.join(changes)}",
                flush=True,
            )

    def _configured_settings(self) -> list[dict[str, Any]]:
        """Each parameter group's configured settings: as built (``__init__``), or as this
        engine was resumed under."""
        if getattr(self, "_configured", None) is None:
            self._configured = optimizer_settings(self.optimizer, self._backend.scheduler)
        return self._configured

    def _apply_settings(
        self, configured: list[dict[str, Any]], saved: list[dict[str, Any]] | None
    ) -> list[str]:
        """``configured`` applied to every group whose ``saved`` configured setting differs
        (``saved`` None: the loaded state's weight decay, betas and eps are compared, not the
        lr); the changes as text."""
        groups, scheduler = self.optimizer.param_groups, self._backend.scheduler
        loaded = optimizer_settings(self.optimizer, scheduler)
        if saved is None or len(saved) != len(groups):
            saved = [{**g, "lr": c["lr"]} for g, c in zip(loaded, configured, strict=True)]
        changes = []
        for i, (group, want, was) in enumerate(zip(groups, configured, saved, strict=True)):
            diff = [k for k in ("lr", "weight_decay", "betas", "eps") if want[k] != was[k]]
            for key in diff:
                if key == "lr":
                    base = scheduler.base_lrs[i]
                    factor = group["lr"] / base if base else 1.0
                    scheduler.base_lrs[i] = want["lr"]
                    group["initial_lr"] = want["lr"]
                    group["lr"] = want["lr"] * factor
                else:
                    group[key] = tuple(want[key]) if key == "betas" else want[key]
            if diff:
                what = ", ".join(f"{k} {was[k]} -> {want[k]}" for k in diff)
                changes.append(f"group {want['name']}: {what}")
        return changes
