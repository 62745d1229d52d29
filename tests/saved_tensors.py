"""Counting the bytes autograd saves for backward: how the tests see gradient checkpointing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def saved_bytes() -> Iterator[list[int]]:
    """Inside the block, ``counter[0]`` adds up the bytes of every tensor saved for backward."""
    counter = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        counter[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter
