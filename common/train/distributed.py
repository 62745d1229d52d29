"""Process-group helpers that also work, as no-ops, in a single process without a launcher."""

from __future__ import annotations

import atexit
import os
from typing import Any

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int, int]:
    """Join the process group when a launcher set RANK and WORLD_SIZE; return (rank, world, local).

    The DeepSpeed launcher and torchrun both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT. Backend: nccl on GPU, gloo on CPU (DeepSpeed's CPU default, oneCCL, is rarely
    installed).
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        import deepspeed

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
        # handlers run last-in first-out: engines made later shut down first, then the group.
        # A group left to the interpreter's teardown can abort the process after its work is
        # done ("terminate called without an active exception", seen with gloo on CPU)
        atexit.register(_destroy_group)
    return dist.get_rank(), dist.get_world_size(), local_rank


def _destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def current_rank() -> int:
    """This process's global rank; the launcher's RANK (or 0) outside a multi-rank group.

    A colocated vLLM engine makes a one-rank group of its own, which says nothing about ours.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def barrier() -> None:
    """Wait for all ranks; nothing to wait for in a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (picklable objects only)."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
