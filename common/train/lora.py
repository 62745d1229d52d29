"""Several named LoRA adapters on one frozen backbone (ARCO's policy and rubric model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

# Export merges plain LoRA (W + scale * B A) only; these options add weights it would drop.
_UNSUPPORTED = ("modules_to_save", "trainable_token_indices", "use_dora")


def is_lora_model(model: nn.Module) -> bool:
    return isinstance(model, PeftModel)


def build_lora_model(base: nn.Module, adapters: Mapping[str, Mapping[str, Any]]) -> PeftModel:
    """Wrap `base` (frozen) with one LoRA adapter per entry of `adapters` (name -> LoraConfig kwargs).

    The first adapter is active; all adapters are trainable, so a loss routed through one adapter
    (see TrainEngine.set_adapter) updates that adapter only.
    """
    if not adapters:
        raise ValueError("build_lora_model: `adapters` is empty; give at least one name -> config")
    configs = {name: _lora_config(name, spec) for name, spec in adapters.items()}
    first, *others = configs
    model = get_peft_model(base, configs[first], adapter_name=first)
    for name in others:
        model.add_adapter(name, configs[name])
    enable_adapter_grads(model)
    return model


def enable_adapter_grads(model: PeftModel) -> None:
    """requires_grad on the LoRA weights of every adapter (peft enables the active one only)."""
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.requires_grad_(True)


def _lora_config(name: str, spec: Mapping[str, Any]) -> LoraConfig:
    unsupported = [key for key in _UNSUPPORTED if spec.get(key)]
    if unsupported:
        raise ValueError(f"LoRA adapter {name!r}: {unsupported} not supported (plain LoRA only)")
    try:
        return LoraConfig(**{"task_type": "CAUSAL_LM", **spec})
    except (TypeError, ValueError) as err:
        raise ValueError(f"LoRA adapter {name!r}: bad config: {err}") from None
