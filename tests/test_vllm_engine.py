"""The colocated vLLM engine: weight pushes (full and LoRA) keep it equal to the trained model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from common.rl import sequence_logprobs
from common.rollout import SamplingConfig
from common.train import build_lora_model, iter_named_weights

pytestmark = pytest.mark.slow

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


@pytest.fixture(scope="module")
def engine(tiny_world):
    from common.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(tiny_world / "model", max_model_len=512, kv_cache_bytes=64 * 2**20)


@pytest.fixture(scope="module")
def lora_engine(tiny_world):
    from common.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(
        tiny_world / "model",
        max_model_len=512,
        kv_cache_bytes=64 * 2**20,
        enable_lora=True,
        max_lora_rank=8,
    )


@pytest.fixture
def model_and_ids(tiny_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    model = AutoModelForCausalLM.from_pretrained(tiny_world / "model", dtype=torch.float32)
    ids = tok.encode("Where was Tusha Shusti born? <search> Tusha Shusti </search>")
    return model, ids


def hf_logprobs(model, ids: list[int], start: int) -> list[float]:
    x = torch.tensor([ids])
    with torch.no_grad():
        logp, _ = sequence_logprobs(model, x, torch.ones_like(x))
    return logp[0, start - 1 :].tolist()


def train_one_step(model, ids: list[int]) -> None:
    """One large AdamW step on the sequence, so the weights move visibly."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    x = torch.tensor([ids])
    logp, _ = sequence_logprobs(model, x, torch.ones_like(x))
    (-logp.mean()).backward()
    opt.step()


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_push_weights_syncs_engine_with_trained_model(engine, model_and_ids):
    model, ids = model_and_ids
    engine.push_weights(iter_named_weights(model))  # the engine starts from the same weights
    split = 4
    before = engine.score([ids[:split]], [ids[split:]])[0]
    assert max_gap(before, hf_logprobs(model, ids, split)) < 1e-4
    train_one_step(model, ids)
    target = hf_logprobs(model, ids, split)
    assert max_gap(engine.score([ids[:split]], [ids[split:]])[0], target) > 1e-2
    engine.push_weights(iter_named_weights(model))
    assert max_gap(engine.score([ids[:split]], [ids[split:]])[0], target) < 1e-4


def test_generation_logprobs_match_model_after_push(engine, model_and_ids):
    model, ids = model_and_ids
    train_one_step(model, ids)
    engine.push_weights(iter_named_weights(model))
    out = engine.generate([ids[:5]], SamplingConfig(n=2, temperature=1.0, max_tokens=12))[0]
    for comp in out:
        assert len(comp.token_ids) == len(comp.logprobs) > 0
        assert max_gap(comp.logprobs, hf_logprobs(model, ids[:5] + comp.token_ids, 5)) < 1e-4


def test_lora_adapters_and_merged_push(engine, lora_engine, model_and_ids):
    base, ids = model_and_ids
    peft = build_lora_model(base, {"policy": LORA, "rubric": LORA})
    for name in ("policy", "rubric"):
        peft.set_adapter(name)
        train_one_step(peft, ids)
    split = 4
    # adapters served by vLLM as LoRA requests, one per name, on the unchanged base
    for name in ("policy", "rubric"):
        lora_engine.push_adapter(name, peft, adapter_name=name)
    for name in ("policy", "rubric"):
        peft.set_adapter(name)
        target = hf_logprobs(peft, ids, split)
        got = lora_engine.score([ids[:split]], [ids[split:]], adapter=name)[0]
        assert max_gap(got, target) < 1e-4
    peft.set_adapter("policy")
    policy = hf_logprobs(peft, ids, split)
    peft.set_adapter("rubric")
    assert max_gap(policy, hf_logprobs(peft, ids, split)) > 1e-3  # the two adapters differ
    # a new adapter version replaces the old one under the same name
    peft.set_adapter("policy")
    train_one_step(peft, ids)
    stale = lora_engine.score([ids[:split]], [ids[split:]], adapter="policy")[0]
    target = hf_logprobs(peft, ids, split)
    assert max_gap(stale, target) > 1e-3
    pushed = sorted(p.name for p in lora_engine._lora_dir.iterdir())
    lora_engine.push_adapter("policy", peft, adapter_name="policy")
    fresh = lora_engine.score([ids[:split]], [ids[split:]], adapter="policy")[0]
    assert max_gap(fresh, target) < 1e-4
    # the old version's folder is gone: one folder a name, however many pushes a run makes
    now = sorted(p.name for p in lora_engine._lora_dir.iterdir())
    assert len(now) == len(pushed) == 2 and now != pushed
    assert sorted(n.rsplit("-", 1)[0] for n in now) == ["policy", "rubric"]
    with pytest.raises(RuntimeError, match="push_adapter"):
        lora_engine.push_weights(iter_named_weights(peft))
    # merged weights of one adapter pushed as full weights into a plain engine
    engine.push_weights(iter_named_weights(peft, merge_lora=True, adapter="policy"))
    assert max_gap(engine.score([ids[:split]], [ids[split:]])[0], target) < 1e-4


def test_generation_progress_counts_the_samples_vllm_finishes(engine, capsys):
    """vLLM's bar, through ``generation_progress``: a finished request adds its n samples; the
    bar's total is the call's samples (`cer eval` on vLLM shows its progress)."""
    from common.train.logging import generation_progress

    params = SamplingConfig(n=2, temperature=1.0, max_tokens=4)
    with generation_progress(engine, "vllm samples"):
        outs = engine.generate([[5, 6, 7], [8, 9]], params)
    assert [len(o) for o in outs] == [2, 2]
    assert re.search(r"vllm samples: 100%.*4/4", capsys.readouterr().err)
    assert engine.progress is None
    engine.generate([[5, 6, 7]], params)  # no bar outside it
    assert "vllm samples" not in capsys.readouterr().err


def test_only_the_expected_reload_warnings_are_hidden():
    import logging

    from common.rollout.vllm_engine import _ExpectedReloadWarnings

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("vllm", logging.WARNING, __file__, 1, message, None, None)

    tied = _ExpectedReloadWarnings(frozenset({"RotaryEmbedding", "ParallelLMHead"}))
    untied = _ExpectedReloadWarnings(frozenset({"RotaryEmbedding"}))
    assert not tied.filter(record("RotaryEmbedding: Failed to load weights"))
    assert not tied.filter(record("ParallelLMHead: Failed to load weights"))
    assert untied.filter(record("ParallelLMHead: Failed to load weights"))
    assert tied.filter(record("QKVParallelLinear: Failed to load weights"))
    assert tied.filter(record("RotaryEmbedding: something else"))


def test_expected_cpu_warnings_are_dropped_and_others_kept():
    import logging

    from common.rollout.vllm_engine import _ExpectedCpuWarnings

    def passes(message: str) -> bool:
        record = logging.LogRecord("vllm.x", logging.WARNING, __file__, 1, message, None, None)
        return _ExpectedCpuWarnings().filter(record)

    assert not passes("libtcmalloc is not found in LD_PRELOAD. For best performance, ...")
    assert not passes("The global random seed is set to 0. Since ...")
    assert passes("KV cache is too small for max_model_len")


@pytest.mark.slow
def test_each_ranks_engine_is_its_own_replica(tiny_world, launch_two_ranks):
    """TRL's colocate layout: no data-parallel group, so ranks may call their engines unequally."""
    script = Path(__file__).parent / "scripts" / "vllm_replica_ranks.py"
    run = launch_two_ranks([str(script), "--model", str(tiny_world / "model")], timeout=300)
    output = run.stdout[-8000:] + run.stderr[-8000:]
    assert run.returncode == 0, output
    assert "rank 0: ok (of 2)" in output and "rank 1: ok (of 2)" in output, output
