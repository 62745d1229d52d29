"""``HFEngine.generate`` on a ZeRO-3 model over two CPU ranks whose generations end apart."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.rollout.engine import SamplingConfig
from common.rollout.hf_engine import HFEngine

SCRIPT = Path(__file__).parent / "scripts" / "hf_zero3_generate.py"
_spec = importlib.util.spec_from_file_location("hf_zero3_generate", SCRIPT)
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


@pytest.mark.slow
def test_zero3_ranks_generating_to_different_lengths_stay_in_step(
    tmp_path, tiny_qwen3_dir, launch_two_ranks
):
    """Rank 0 stops at its first token, rank 1 generates 12: before ``generate`` passed
    ``synced_gpus`` under ZeRO-3 (the DeepSpeed config that would tell transformers is gone
    after the load), rank 0 left the loop and rank 1 waited for its share of every layer for
    ever. Rank 1's tokens are the unpartitioned model's greedy ones."""
    args = [str(SCRIPT), "--model", str(tiny_qwen3_dir), "--out", str(tmp_path)]
    run = launch_two_ranks([*args, "--timeout", "120"], timeout=600)
    output = run.stdout[-10000:] + run.stderr[-10000:]
    assert run.returncode == 0, output
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    prompt = tokenizer(script.PROMPT).input_ids
    params = SamplingConfig(temperature=0.0, max_tokens=script.MAX_TOKENS)
    [[whole]] = HFEngine(model, tokenizer).generate([prompt], params)
    assert whole.finish_reason == "length" and len(whole.token_ids) == script.MAX_TOKENS
    assert rank0 == {"first": whole.token_ids[0], "tokens": whole.token_ids[:1], "finish": "stop"}
    assert rank1 == {"first": whole.token_ids[0], "tokens": whole.token_ids, "finish": "length"}
