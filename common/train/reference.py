"""The frozen initial policy π_ref for the KL term."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from common.rl import forward_logprobs
from common.train.lora import is_lora_model


class ReferenceModel:
    """π_ref: a frozen deep copy (eval mode, no gradients) of the model as it is now, or, for a
    LoRA model, the same module with its adapters disabled, which is the frozen base (no copy).

    Build it before DeepSpeed ZeRO-3 partitions a full model (`TrainEngine(..., reference=True)`).
    """

    def __init__(self, model: nn.Module):
        if is_lora_model(model):
            self._lora = model
            self._copy = None
            return
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            raise ValueError(
                "ReferenceModel: the model is already partitioned by ZeRO-3; "
                "build it with TrainEngine(model, config, reference=True)"
            )
        self._lora = None
        self._copy = copy.deepcopy(model).eval().requires_grad_(False)

    @torch.no_grad()
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward output under π_ref, without gradients."""
        if self._copy is not None:
            return self._copy(*args, **kwargs)
        was_training = self._lora.training
        self._lora.eval()  # no LoRA dropout; the base has none in eval
        try:
            with self._lora.disable_adapter():
                return self._lora(*args, **kwargs)
        finally:
            self._lora.train(was_training)

    __call__ = forward

    def logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[batch, seq_len, vocab] logits of π_ref."""
        return self.forward(input_ids=input_ids, attention_mask=attention_mask).logits

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        chunk_size: int = 1024,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """log π_ref(x_{t+1} | x_≤t), [batch, seq_len - 1] in float32, without its logits: the
        head projects `chunk_size` positions at a time (`common.rl.forward_logprobs`)."""
        model = self._copy if self._copy is not None else self._lora
        return forward_logprobs(
            self.forward, input_ids, attention_mask, chunk_size, temperature, model=model
        )
