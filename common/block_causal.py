"""Block-causal packing: sequences that share their first tokens forwarded as one row.

A group of token sequences (e.g. the rubric prompts of one trajectory's steps) is packed as one
*trunk* (one of the sequences, whole) followed by each other sequence's *tail*: its tokens after
its branch point, the length of its common start with the trunk. Under ``block_causal_mask`` a
trunk token sees the trunk up to itself; a tail token sees the trunk before its branch point
and its own tail up to itself, never another tail; positions (``position_ids``) of a tail
continue from its branch point. Every token of every sequence then has the hidden state it has
when its sequence is forwarded alone under a causal mask, and the shared start is computed once.

``PackedTree.index[r]`` maps sequence r's tokens to packed positions, so anything taken per
token or pooled per sequence on the sequence alone can be taken on the packed row.
(``cer/rewards/scoring.py`` does the same with a cached trunk under ``inference_mode``; this packs trunk
and tails into one row, so one forward carries gradients to the shared part.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

TRUNK, PAD = 0, -1  # segment ids: the trunk, padding; tail r is segment r + 1


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common start of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class PackedTree:
    """One group packed: ids, positions, segment (``TRUNK``, r + 1 for sequence r's tail) and
    visible (how many trunk tokens each token sees) per packed position; ``index[r]`` the
    packed position of each token of sequence r; ``trunk`` which sequence is the trunk."""

    ids: list[int]
    positions: list[int]
    segment: list[int]
    visible: list[int]
    index: list[list[int]]
    trunk: int

    def __len__(self) -> int:
        return len(self.ids)


def choose_trunk(seqs: Sequence[Sequence[int]]) -> int:
    """The sequence whose common starts with all the others are longest in sum (ties: the
    last): the trunk that saves the most tokens."""
    if not seqs:
        raise ValueError("choose_trunk: no sequences")
    best, best_saved = len(seqs) - 1, -1
    for c in range(len(seqs) - 1, -1, -1):
        saved = sum(common_length(s, seqs[c]) for r, s in enumerate(seqs) if r != c)
        if saved > best_saved:
            best, best_saved = c, saved
    return best


def pack_tree(seqs: Sequence[Sequence[int]], trunk: int | None = None) -> PackedTree:
    """Pack ``seqs`` as the trunk ``seqs[trunk]`` (default ``choose_trunk``) then each other
    sequence's tail after its common start with the trunk (an empty tail for a sequence that is
    a start of the trunk), in sequence order."""
    if any(not s for s in seqs):
        raise ValueError("pack_tree: an empty sequence")
    c = choose_trunk(seqs) if trunk is None else trunk
    base = list(seqs[c])
    ids, positions = list(base), list(range(len(base)))
    segment, visible = [TRUNK] * len(base), [p + 1 for p in range(len(base))]
    index: list[list[int]] = []
    for r, s in enumerate(seqs):
        if r == c:
            index.append(list(range(len(base))))
            continue
        b = common_length(s, base)
        start = len(ids)
        ids.extend(s[b:])
        positions.extend(range(b, len(s)))
        segment.extend([r + 1] * (len(s) - b))
        visible.extend([b] * (len(s) - b))
        index.append(list(range(b)) + list(range(start, start + len(s) - b)))
    return PackedTree(ids, positions, segment, visible, index, c)


def block_causal_mask(
    segment: torch.Tensor, visible: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Additive attention mask [B, 1, N, N] (0 where allowed, the dtype's minimum elsewhere) for
    rows of packed trees: query q sees key k when k is a trunk token before ``visible[q]``, or
    k <= q in q's own tail. Padding (segment ``PAD``) sees earlier padding only and is seen by
    no real token. Shapes: segment, visible [B, N] (long)."""
    n, device = segment.shape[1], segment.device
    k = torch.arange(n, device=device)
    trunk_key = (segment == TRUNK)[:, None, :] & (k[None, None, :] < visible[:, :, None])
    same = segment[:, :, None] == segment[:, None, :]
    own = same & (segment != TRUNK)[:, :, None] & (k[None, :] <= k[:, None])[None]
    allowed = trunk_key | own  # [B, N, N]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def pad_trees(
    trees: Sequence[PackedTree], pad_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows of ``trees``: ids, position_ids, segment (``PAD`` on padding) and
    visible, each [B, N] (long)."""
    width = max(len(t) for t in trees)

    def rows(field: str, fill: int) -> torch.Tensor:
        data = [getattr(t, field) + [fill] * (width - len(t)) for t in trees]
        return torch.tensor(data, dtype=torch.long, device=device)

    return rows("ids", pad_id), rows("positions", 0), rows("segment", PAD), rows("visible", 0)
