"""GPU memory by phase of a training step, for the step's metrics (nothing on a CPU).

A step has three phases, each ended by a ``phase_memory`` call: ``rollout`` (generation, reward,
and vLLM's sleep when ``engine.sleep_during_update``), ``update`` (the optimizer step, vLLM
asleep) and ``push`` (vLLM woken, the new weights loaded). Per phase:

- ``memory/<phase>_device_gib``: the device's use (``torch.cuda.mem_get_info``: every process,
  the CUDA context, torch's cached blocks, vLLM's mapped pages) at the phase's end, or more where
  a reading inside the phase saw more (``note_device_use``: the one taken just before vLLM
  sleeps, when it and the rollout's memory are both on the device). Torch's caching allocator
  keeps the segments of the phase's peak reserved until ``empty_cache``, so the reading at the
  phase's end sees that peak too.
- ``memory/<phase>_peak_gib``: the most torch's allocator held in the phase
  (``max_memory_allocated``), less the bytes of vLLM's sleep pool where vLLM slept through the
  phase (``asleep_pool``: the update). vLLM's weights and KV cache are tensors of a MemPool of
  torch's caching allocator: sleeping unmaps their pages but the tensors stay, so the allocator
  still counts them though the device no longer holds them. The pool's bytes are what the sleep
  freed on the device (``common.guards.SleepCheck``, measured after ``empty_cache``: the unmapped
  pages), which is vLLM's own count of its pool up to page rounding.

Both then mean what the memory plan (``common.train.memory_plan``) means by a phase's peak: what
the device holds, a sleeping vLLM's released share not in it. ``phase_readings`` is the pure
part (tested with hand-computed readings); ``phase_memory`` reads the device.
"""

from __future__ import annotations

import torch

GIB = 2**30

# The most device use seen inside the current phase (``note_device_use``), in bytes.
_seen_in_phase = [0]


def phase_readings(
    phase: str,
    allocated_peak: int,
    free: int,
    total: int,
    asleep_pool: int = 0,
    seen_used: int = 0,
) -> dict[str, float]:
    """The phase's metrics (GiB) from its readings (bytes): ``allocated_peak``, the allocator's
    peak in the phase; ``free`` and ``total``, ``mem_get_info`` at its end; ``asleep_pool``, the
    bytes of vLLM's pool that slept through the phase (0 when it was awake at any time in it);
    ``seen_used``, the most device use read inside the phase."""
    peak = max(allocated_peak - asleep_pool, 0)
    device = max(total - free, seen_used)
    return {f"memory/{phase}_peak_gib": peak / GIB, f"memory/{phase}_device_gib": device / GIB}


def device_memory() -> tuple[int, int] | None:
    """(bytes in use, total bytes) of this process's GPU, every process's use included; None
    without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free, total


def release_cached() -> None:
    """Torch's cached, unused blocks back to the device (a no-op without CUDA): a reading after
    it counts what tensors hold, not the allocator's cache."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def note_device_use(used: int) -> None:
    """A reading of the device's use inside the current phase: the phase's
    ``memory/<phase>_device_gib`` is at least this."""
    _seen_in_phase[0] = max(_seen_in_phase[0], int(used))


def phase_memory(phase: str, asleep_pool: int = 0) -> dict[str, float]:
    """``memory/<phase>_peak_gib`` and ``memory/<phase>_device_gib`` of the phase that ends now
    (the module docstring); the allocator's peak counter and the readings noted in the phase are
    reset here. ``asleep_pool``: the bytes of vLLM's pool asleep through the phase (what its
    sleep freed). Empty without CUDA."""
    seen, _seen_in_phase[0] = _seen_in_phase[0], 0
    if not torch.cuda.is_available():
        return {}
    peak = torch.cuda.max_memory_allocated()
    free, total = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    return phase_readings(phase, peak, free, total, asleep_pool, seen)
