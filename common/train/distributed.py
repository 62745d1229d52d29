"""Process-group helpers that also work, as no-ops, in a single process without a launcher."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int, int]:
    """Join the process group when a launcher set RANK and WORLD_SIZE; return (rank, world, local).

    The DeepSpeed launcher and torchrun both set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT. Backend: nccl on GPU, gloo on CPU (DeepSpeed's CPU default, oneCCL, is rarely
    installed). First this rank's torch threads are set to its share of the host
    (``set_rank_threads``).
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0
    set_rank_threads()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        import deepspeed

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
        if backend == "gloo":
            _unlink_shm_buffer(dist.get_rank())
        # handlers run last-in first-out: engines made later shut down first, then the group
        # (DeepSpeed still holds its groups after that: a command ends with exit_process)
        atexit.register(_destroy_group)
    return dist.get_rank(), dist.get_world_size(), local_rank


def threads_per_rank(threads: int, env: Mapping[str, str] | None = None) -> int:
    """This rank's share of the host's ``threads`` when a launcher started several ranks on it
    (``LOCAL_WORLD_SIZE`` from torchrun, ``LOCAL_SIZE`` from the DeepSpeed launcher), at least 1:
    every rank taking all of them oversubscribes the cores k times."""
    env = os.environ if env is None else env
    local = int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or 1)
    return max(1, threads // max(local, 1))


def set_rank_threads(env: Mapping[str, str] | None = None) -> int:
    """Set torch's threads in a rank a launcher started: ``threads_per_rank`` of the CPUs this
    process may run on, never more than it has (an ``OMP_NUM_THREADS`` or ``torch_threads``
    below its share stands); ``OMP_NUM_THREADS`` is set to the result for what it starts and
    for vLLM, which reads it (``VLLMEngine``). Returns the thread count.

    ``OMP_NUM_THREADS`` set once torch's thread pool exists changes nothing, and the DeepSpeed
    launcher sets none (torchrun sets 1): without this every rank kept every core of the host.
    A launcher that binds each rank to its own cores (DeepSpeed's ``--bind_cores_to_rank``) is
    not told apart from ranks sharing them: its ranks get a LOCAL_SIZE-th of their own cores.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = min(torch.get_num_threads(), threads_per_rank(cpus or 1, env))
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


def _unlink_shm_buffer(rank: int) -> None:
    """Remove the name of this rank's DeepSpeed CPU allreduce buffer once every rank has mapped it.

    On CPU, when every rank is on one host (the launcher sets LOCAL_SIZE), DeepSpeed's shm
    allreduce gives each rank a 69 MB segment in /dev/shm and never unlinks it: each two-rank CPU
    run left 138 MB of RAM behind (18 GB on this machine after a day of tests). The segments stay
    mapped, so the collectives keep working; the memory goes when the last rank exits, however it
    exits. The first barrier waits for every rank to have opened its peers' segments, the second
    for every rank to have unlinked its own: on return no rank's name is left.
    """
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    name = f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"  # as shm.cpp names it
    dist.barrier()
    Path("/dev/shm", name).unlink(missing_ok=True)
    dist.barrier()


def _destroy_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int | None = 0) -> NoReturn:
    """Leave the process with ``code``, as ``sys.exit(code)`` would; a command's last call.

    A rank of a multi-rank run first does Python's exit work itself (waits for its non-daemon
    threads, runs the atexit handlers, the group's destruction among them, flushes its streams)
    and then leaves through ``os._exit``, skipping C++'s static destructors. DeepSpeed keeps its
    process groups alive past ``destroy_process_group`` (ZeRO-3's module stack and its cloned
    world group are module globals), so gloo's threads still run while those destructors do,
    and that race now and then aborted a rank whose work was done ("terminate called without an
    active exception", SIGABRT; three times in CI, in two-rank tests that had printed their
    results; once more in a TRL run, whose group accelerate made). A rank is any process a
    launcher started (RANK and WORLD_SIZE set), whoever made its group; a single process exits
    the usual way.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        sys.exit(code)
    threading._shutdown()  # what the interpreter's own exit does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code or 0)


def refuse_ranks(command: str, why: str) -> None:
    """Stop a one-process command that a launcher started as several ranks (``WORLD_SIZE`` > 1),
    before it loads anything: with no process group of its own, every rank would take the same
    GPU (``cuda:0``), do the whole work and write the same files. ``why``: what is not split."""
    world = os.environ.get("WORLD_SIZE", "1").strip() or "1"
    if world != "1":
        raise ValueError(
            f"runs in one process, not under a launcher's ranks (WORLD_SIZE={world}): start it "
            f"with `python -m {command} ...`, without the DeepSpeed launcher or torchrun ({why})"
        )


def current_rank() -> int:
    """This process's global rank; the launcher's RANK (or 0) outside a multi-rank group.

    A colocated vLLM engine makes a one-rank group of its own, which says nothing about ours.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def collective_device() -> torch.device:
    """The device a collective's tensors must live on: this rank's CUDA device under NCCL (which
    takes CUDA tensors only), the CPU under gloo or outside a group.

    vLLM's worker makes an NCCL world group even on one GPU, so "a group exists" says nothing
    about the device; the backend does.
    """
    if dist.is_available() and dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def is_multi_rank() -> bool:
    """Whether this process is one of several ranks of a process group (a colocated vLLM engine's
    own one-rank group does not count)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_values(values: list[float], op: str = "sum", dtype=torch.float64) -> list[float]:
    """``values`` reduced elementwise over the ranks (``op``: sum | max | min), through a tensor on
    ``collective_device()``; ``values`` unchanged in a single process. Every tensor collective of
    the project goes through here, so none sends a CPU tensor to NCCL."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if op not in ops:
        raise ValueError(f"all_reduce_values: op must be one of {sorted(ops)}, not {op!r}")
    if not is_multi_rank():
        return [float(v) for v in values]
    return reduce_in_group(values, op, dtype)


def any_rank(flags: Sequence[bool]) -> list[bool]:
    """Each flag true on any rank (an all-reduce of their max; the flags unchanged in one
    process): a decision every rank then takes alike. A collective: every rank calls it with
    the same number of flags."""
    return [v > 0 for v in all_reduce_values([float(bool(f)) for f in flags], "max")]


def reduce_in_group(values: list[float], op: str = "sum", dtype=torch.float64) -> list[float]:
    """The collective ``all_reduce_values`` makes, in the process group as it is (one rank's
    too: ``make gpu-check-bare`` runs it on one NCCL rank, where ``all_reduce_values`` takes its
    one-process path)."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    t = torch.tensor(values, dtype=dtype, device=collective_device())
    dist.all_reduce(t, op=ops[op])
    return t.cpu().tolist()


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
