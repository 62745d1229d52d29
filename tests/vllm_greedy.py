"""vLLM's greedy continuation of a prompt with its log-probs, in a subprocess: a model folder's
check against transformers (the tiny world's model, SmolLM2). The subprocess keeps vLLM's
process-wide effects (global seeds, thread binding) out of the test session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPT = """
import json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
start = time.perf_counter()
from vllm import LLM, SamplingParams
imported = time.perf_counter()
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 * 2**20,
          max_model_len=1024, skip_tokenizer_init=False, seed=0)
ready = time.perf_counter()
prompt = json.loads(sys.argv[2])
out = llm.generate([{"prompt_token_ids": prompt}],
                   SamplingParams(max_tokens=int(sys.argv[3]), temperature=0.0, logprobs=0,
                                  ignore_eos=True),
                   use_tqdm=False)[0].outputs[0]
logprobs = [step[t].logprob for step, t in zip(out.logprobs, out.token_ids)]
print(json.dumps({"ids": list(out.token_ids), "logprobs": logprobs, "text": out.text,
                  "import_s": imported - start, "engine_s": ready - imported}))
"""


def vllm_greedy(model: Path, prompt: list[int], tokens: int = 8) -> dict[str, Any]:
    """``{"ids", "logprobs", "text", "import_s", "engine_s"}`` of vLLM's greedy ``tokens``."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), json.dumps(prompt), str(tokens)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
