"""The rehearsal's training precision on a CPU: the paper's bf16 where the CPU computes it,
fp32 where torch would only emulate it.

Without AVX-512 BF16 (``avx512_bf16`` in ``/proc/cpuinfo``'s flags) torch converts every bf16
matmul to fp32 and back, which makes a bf16 rehearsal several times slower than an fp32 one
and checks nothing more: the paper configs themselves stay bf16, and ``make gpu-check`` runs
their bf16 on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BF16_FLAG = "avx512_bf16"
FALLBACK_NOTE = f"bf16 -> fp32: this CPU has no {BF16_FLAG}"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of ``/proc/cpuinfo``'s text (``flags`` lines, x86; ``Features``, ARM)."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


def has_bf16(cpuinfo: str) -> bool:
    """Whether a CPU whose ``/proc/cpuinfo`` reads ``cpuinfo`` computes bf16 matmuls natively."""
    return BF16_FLAG in cpu_flags(cpuinfo)


def read_cpuinfo(path: Path = Path("/proc/cpuinfo")) -> str:
    """``/proc/cpuinfo``'s text, or "" where there is none (then bf16 counts as emulated)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def cpu_bf16(configured: Any, cpuinfo: str) -> tuple[bool, str]:
    """``train.bf16`` for a CPU rehearsal of a config whose ``train.bf16`` is ``configured``
    (``True``, ``False`` or ``"auto"``), and the report's line ("" when nothing changes).

    "auto" is bf16 on every GPU the papers used, so it rehearses as bf16, as ``True`` does,
    unless the CPU lacks ``avx512_bf16``: then fp32. ``False`` stays fp32."""
    if configured not in (True, False, "auto"):
        raise ValueError(f"train.bf16={configured!r}: expected true, false or auto")
    if configured is False:
        return False, ""
    if not has_bf16(cpuinfo):
        return False, f"train.bf16=false ({FALLBACK_NOTE}; emulated bf16 is several times slower)"
    if configured == "auto":
        return True, "train.bf16=true: 'auto' resolves to bf16 on the papers' GPUs (on CPU to fp32)"
    return True, ""
