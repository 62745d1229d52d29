"""Global batch sizes (as verl's ``data.train_batch_size``): a config holds the paper's number of
questions (and rollouts) per update whatever the GPU count; each data-parallel rank takes its
contiguous slice of the batch one rank would draw, so R ranks train on the same questions, in the
same order, as one rank.

    one-rank batch of step s:  step_batch(s, order, B)          (B indices into the train set)
    rank r of R:               rank_slice(that batch, r, R)     (B / R of them, contiguous)

A batch that does not divide over the ranks is a ``ConfigError`` naming the key, the value and
the world size, raised before any model loads (``data_world_size`` reads the launcher's
``WORLD_SIZE``, the group ``init_distributed`` joins later).

``BatchLog`` writes, on the main rank, every step's question ids over all ranks in rank order and
the number of trajectories of the update to ``run_dir/batches.jsonl``: which questions each update
trained on, and what the two-rank tests compare with one rank's draw.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from common.config import ConfigError
from common.jsonl import read_jsonl_lines, trim_jsonl


def data_world_size() -> int:
    """The number of data-parallel ranks this process will join: the launcher's ``WORLD_SIZE``
    when it set ``RANK`` and ``WORLD_SIZE`` (as ``init_distributed`` reads them), else 1."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 1
    return int(os.environ["WORLD_SIZE"])


def per_rank(total: int, world: int, key: str, what: str = "questions") -> int:
    """``total`` (the config's global ``key``) split over ``world`` ranks; a ``ConfigError`` in one
    line when it does not divide."""
    if world < 1 or total % world:
        raise ConfigError(
            f"{key}={total} does not split over world size {world}: batch sizes are global "
            f"(the {what} of one update over all ranks); set {key} to a multiple of {world}"
        )
    return total // world


def check_micro_batches(per_rank_batch: int, micro: int, key: str, micro_key: str, world: int):
    """Each rank's trajectories per update must be whole micro-batches; returns grad_accum."""
    if per_rank_batch % micro:
        raise ConfigError(
            f"{key} gives {per_rank_batch} trajectories per rank at world size {world}, not a "
            f"multiple of {micro_key}={micro}"
        )
    return per_rank_batch // micro


def group_grad_accum(
    questions: int,
    key: str,
    n: int,
    n_key: str,
    micro: int,
    micro_key: str,
    what: str = "questions",
) -> int:
    """grad_accum of a group-sampling trainer: the global ``questions`` (config key ``key``) over
    this launch's ranks, ``n`` samples each (``n_key``), in micro-batches of ``micro``; one
    ``ConfigError`` line when either does not divide. Run it before any load."""
    world = data_world_size()
    rank_q = per_rank(questions, world, key, what)
    return check_micro_batches(rank_q * n, micro, f"{key}*{n_key}", micro_key, world)


def step_batch(step: int, order: Sequence[int], size: int) -> list[int]:
    """The one-rank batch of ``step`` (1-based): the next ``size`` entries of ``order`` after the
    ``step - 1`` batches before it, wrapping around at the end."""
    base = (step - 1) * size
    return [order[(base + i) % len(order)] for i in range(size)]


def rank_slice(batch: Sequence[int], rank: int, world: int) -> list[int]:
    """Rank ``rank``'s contiguous share of ``batch`` (its length divides by ``world``)."""
    if len(batch) % world:
        raise ValueError(f"a batch of {len(batch)} does not split over {world} ranks")
    k = len(batch) // world
    return list(batch[rank * k : (rank + 1) * k])


def rank_questions(step: int, rank: int, world: int, order: Sequence[int], size: int) -> list[int]:
    """This rank's question indices for ``step``: its slice of the one-rank batch of ``size``."""
    return rank_slice(step_batch(step, order, size), rank, world)


class BatchLog:
    """``run_dir/batches.jsonl``: one row a step, ``{"step", "ids", "trajectories"}``, the ids of
    every rank's questions in rank order (the one-rank batch) and the update's trajectories over
    all ranks. Every rank calls ``write`` (a collective); the main rank writes. Rows from
    ``start`` on are dropped when it opens (atomically, the kept lines as written), so a resumed
    run logs each step once; a torn last line (a kill mid-write) is dropped with a warning, any
    other bad line is a ``ValueError`` naming file:line (``common.jsonl.read_jsonl``). A run's
    start has trimmed it already (``RunFolder.begin`` -> ``trim_run``, with metrics.jsonl and
    before either is rewritten)."""

    def __init__(self, run_dir: Path, start: int, is_main: bool):
        self.path = Path(run_dir) / "batches.jsonl"
        self.is_main = is_main
        if is_main and self.path.exists():  # (a run's start trimmed it already: trim_run)
            rows = read_jsonl_lines(self.path, key="step", stacklevel=3)
            trim_jsonl(self.path, rows, lambda r: r["step"] < start)

    def write(self, step: int, ids: Sequence[str], trajectories: int) -> None:
        parts = [(list(ids), trajectories)]
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, (list(ids), trajectories))
        if self.is_main:
            row = {
                "step": step,
                "ids": [i for p, _ in parts for i in p],
                "trajectories": sum(n for _, n in parts),
            }
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
