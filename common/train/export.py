"""Full weights under Hugging Face names, for vLLM weight pushes and HF checkpoints."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from peft.tuners.lora import LoraLayer
from torch import nn

from common.train.distributed import current_rank
from common.train.engine import TrainEngine
from common.train.lora import is_lora_model

_PEFT_PREFIX = "base_model.model."


def iter_named_weights(
    source: TrainEngine | nn.Module, merge_lora: bool = True, adapter: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every parameter and persistent buffer, with the names that
    `save_pretrained` writes and vLLM's `load_weights` accepts.

    LoRA models: each adapted weight is yielded as W + (alpha / r) * B @ A of `adapter` (default:
    the active one) when merge_lora, else as the base W; LoRA weights themselves never appear.
    Tied weights appear once. Under ZeRO-3 every rank must consume the whole iterator (the
    gathers are collective) and tensors are copies; otherwise they may share storage with the
    live parameters.
    """
    model = source.model if isinstance(source, TrainEngine) else source
    merge = None
    if is_lora_model(model) and merge_lora:
        merge = adapter or model.active_adapter
        if merge not in model.peft_config:
            raise ValueError(
                f"iter_named_weights: no adapter {merge!r}; have {sorted(model.peft_config)}"
            )
    prefix = _PEFT_PREFIX if is_lora_model(model) else ""
    seen: set[int] = set()
    for name, tensor in _walk(model, "", merge, seen):
        yield name.removeprefix(prefix), tensor


def export_hf_state_dict(
    source: TrainEngine | nn.Module,
    merge_lora: bool = True,
    adapter: str | None = None,
    rank0_only: bool = True,
) -> dict[str, torch.Tensor]:
    """The full model state dict on CPU with HF names (see iter_named_weights).

    All ranks must call it (ZeRO-3 gathers are collective); with rank0_only, other ranks get {}.
    """
    keep = not rank0_only or current_rank() == 0
    state = {}
    for name, tensor in iter_named_weights(source, merge_lora, adapter):
        if keep:
            state[name] = tensor.to("cpu", copy=True)
    return state


def _walk(
    module: nn.Module, prefix: str, merge: str | None, seen: set[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(module, LoraLayer):
        yield from _lora_layer(module, prefix, merge, seen)
        return
    params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
    seen.update(id(p) for _, p in params)
    with _gathered([p for _, p in params]) as copy:
        for name, param in params:
            yield prefix + name, _out(param, copy)
    for name, buffer in module.named_buffers(recurse=False):
        if name not in module._non_persistent_buffers_set:
            yield prefix + name, buffer.detach()
    for name, child in module.named_children():
        yield from _walk(child, f"{prefix}{name}.", merge, seen)


def _lora_layer(
    layer: LoraLayer, prefix: str, merge: str | None, seen: set[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The base layer's weights under the LoRA layer's own name, merged with adapter `merge`."""
    base = layer.get_base_layer()
    adapted = merge is not None and (merge in layer.lora_A or merge in layer.lora_embedding_A)
    if adapted and merge in layer.lora_variant:
        raise ValueError(f"{prefix}: adapter {merge!r} is not plain LoRA and cannot be merged here")
    with _gathered(list(layer.parameters())) as copy:
        for name, param in base.named_parameters(recurse=False):
            seen.add(id(param))
            with torch.no_grad():
                if adapted and name == "weight":
                    delta = layer.get_delta_weight(merge)
                elif adapted and name == "bias" and layer.lora_bias.get(merge, False):
                    delta = layer.lora_B[merge].bias * layer.scaling[merge]
                else:
                    delta = None
                value = _out(param, copy) if delta is None else param + delta.to(param.dtype)
            yield prefix + name, value
        for name, buffer in base.named_buffers(recurse=False):
            if name not in base._non_persistent_buffers_set:
                yield prefix + name, buffer.detach()


def _out(tensor: torch.Tensor, copy: bool) -> torch.Tensor:
    return tensor.detach().clone() if copy else tensor.detach()


@contextlib.contextmanager
def _gathered(params: Iterable[nn.Parameter]) -> Iterator[bool]:
    """Gather ZeRO-3 shards of `params` on every rank; yields whether tensors must be copied out."""
    partitioned = [p for p in params if hasattr(p, "ds_id")]
    if not partitioned:
        yield False
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        yield True
