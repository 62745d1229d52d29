"""Token sequences (prompt + response with a loss mask) into padded training tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.rollout.trajectory import Trajectory


@dataclass
class TokenBatch:
    """Right-padded batch; label-aligned tensors are shifted by one (position t predicts t+1)."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1], 1.0 where input_ids[:, t+1] was sampled
    sampling_logprobs: torch.Tensor  # [B, T-1], engine logprob of input_ids[:, t+1]

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(*(x.to(device) for x in vars(self).values()))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def padding_id(tokenizer) -> int:
    """The id right-padded batches fill with: the tokenizer's pad token, else its end of sequence
    (Llama 3.2 has no pad token), else 0. Padded positions are masked out of attention and loss,
    so any id does; a missing one must not crash."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def collate(trajs: Sequence[Trajectory], pad_id: int) -> TokenBatch:
    """Pad prompt + response ids; the loss mask covers sampled response tokens only."""
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    b = len(trajs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    mask = torch.zeros((b, width - 1))
    lps = torch.zeros((b, width - 1))
    for i, t in enumerate(trajs):
        p, r = len(t.prompt_ids), len(t.response_ids)
        ids[i, : p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        attn[i, : p + r] = 1
        if r:
            mask[i, p - 1 : p + r - 1] = torch.tensor(t.loss_mask, dtype=torch.float)
            lps[i, p - 1 : p + r - 1] = torch.tensor(t.sampling_logprobs)
    return TokenBatch(ids, attn, mask, lps)
