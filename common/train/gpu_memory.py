"""GPU memory by phase of a training step, for the step's metrics (nothing on a CPU)."""

from __future__ import annotations

import torch

GIB = 2**30


def phase_memory(phase: str) -> dict[str, float]:
    """``memory/<phase>_peak_gib``: the most memory torch's allocator held since the previous
    call (its peak counter is reset here), and ``memory/<phase>_device_gib``: what the whole
    device holds now, vLLM's own pool and other processes included. Empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    peak = torch.cuda.max_memory_allocated() / GIB
    free, total = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    return {f"memory/{phase}_peak_gib": peak, f"memory/{phase}_device_gib": (total - free) / GIB}
