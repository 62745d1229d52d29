"""`policy_update` without a [batch, length, vocabulary] tensor: the policy's and the
reference's token log-probs come from the head applied a chunk of positions at a time, and equal
the old path (the model's whole logits, the reference's whole fp32 log-softmax)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

import common.rl_loop as rl_loop
from common.rl import forward_logprobs, logprobs_from_logits
from common.rl_loop import LossConfig, policy_update
from common.rollout.trajectory import Trajectory
from common.train import ReferenceModel, TrainConfig, TrainEngine, export_hf_state_dict

VOCAB, HIDDEN = 251, 16  # a prime vocabulary: no other dimension equals it


def tiny(tied: bool, seed: int = 0) -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=tied,
    )
    return transformers.Qwen3ForCausalLM(config).float()


def trajectories(n: int, seed: int = 0) -> list[Trajectory]:
    """Uneven prompts and responses, some response tokens inserted (loss mask 0)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, r = (int(x) for x in torch.randint(2, 9, (2,), generator=g))
        prompt = torch.randint(1, VOCAB, (p,), generator=g).tolist()
        t = Trajectory("g", i, "q", "q", ["a"], prompt)
        t.append(
            torch.randint(1, VOCAB, (r,), generator=g).tolist(), sampled=True, logprobs=[0.0] * r
        )
        t.append(torch.randint(1, VOCAB, (2,), generator=g).tolist(), sampled=False)
        t.append([int(torch.randint(1, VOCAB, (1,), generator=g))], sampled=True, logprobs=[0.0])
        out.append(t)
    return out


def old_forward_logprobs(
    forward, input_ids, attention_mask, chunk_size=4096, temperature=1.0, entropy=None
):
    """The unchunked path: the model's whole logits, log-softmax in chunks (and the entropy of
    every position from the whole fp32 log-softmax)."""
    logits = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    if entropy is not None:
        with torch.no_grad():
            logp = torch.log_softmax(logits[:, :-1].float() / temperature, -1)
            entropy.append(-(logp.exp() * logp).sum(-1))
    return logprobs_from_logits(logits[:, :-1] / temperature, input_ids[:, 1:], chunk_size)


@torch.no_grad()
def old_reference_logprobs(self, input_ids, attention_mask=None, chunk_size=1024):
    """The unchunked reference: a whole fp32 log-softmax of its logits."""
    logits = self.logits(input_ids, attention_mask)
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, input_ids[:, 1:, None])[..., 0]


def use_old_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rl_loop, "forward_logprobs", old_forward_logprobs)
    monkeypatch.setattr(ReferenceModel, "logprobs", old_reference_logprobs)


def update(
    tied: bool, kl_coef: float, chunk: int = 5, n: int = 6, mbs: int = 3
) -> tuple[dict, dict, dict]:
    """One policy_update from fixed weights: (stats, gradients at the step, weights after)."""
    engine = TrainEngine(
        tiny(tied), TrainConfig(lr=1e-2, grad_accum=n // mbs), reference=kl_coef > 0
    )
    with torch.no_grad():  # the policy away from its reference, so the KL has a gradient
        for p in engine.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    grads: dict[str, torch.Tensor] = {}
    step = engine._backend.step

    def recording_step(boundary: bool, skip: bool = False):
        if boundary:
            grads.update({k: p.grad.clone() for k, p in engine.model.named_parameters()})
        return step(boundary, skip)

    engine._backend.step = recording_step
    advantages = torch.randn(n, generator=torch.Generator().manual_seed(7))
    cfg = LossConfig(micro_batch_size=mbs, kl_coef=kl_coef, logprob_chunk=chunk)
    stats = policy_update(engine, trajectories(n), advantages, cfg, pad_id=0)
    weights = {k: p.detach().clone() for k, p in engine.model.named_parameters()}
    return stats, grads, weights


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_policy_update_equals_the_whole_logits_path(tied, kl_coef, monkeypatch):
    new_stats, new_grads, new_weights = update(tied, kl_coef)
    use_old_path(monkeypatch)
    old_stats, old_grads, old_weights = update(tied, kl_coef)
    assert (
        set(new_stats)
        == set(old_stats)
        == {"loss", "clip_frac", "grad_norm", "tokens/update", "tokens/update_padded"}
        | {"tokens/reference", "tokens/update_forwarded", "logprob_gap", "train_mode"}
        | {"update_rows", "entropy", "lr", "response_length/mean", "response_length/max"}
        | ({"kl"} if kl_coef else set())
    )
    if kl_coef:
        assert old_stats["kl"] > 1e-4
    for key, value in old_stats.items():
        assert new_stats[key] == pytest.approx(value, abs=1e-6), key
    assert set(new_grads) == set(old_grads) and ("lm_head.weight" in old_grads) != tied
    for name, grad in old_grads.items():
        torch.testing.assert_close(new_grads[name], grad, atol=1e-6, rtol=0, msg=name)
        # Adam's first step is lr·g/(|g| + ε), about lr·sign(g): where |g| > 1e-4 the paths'
        # gradients (equal to 1e-6) give one step; where g is near 0 its rounding may move the
        # entry anywhere within ±lr (1e-2), and did (1.1e-5 under one pinned thread)
        clear = grad.abs() > 1e-4
        diff = (new_weights[name] - old_weights[name]).abs()
        assert not clear.any() or float(diff[clear].max()) <= 1e-5, name
        assert float(diff.max()) <= 2e-2, name


def test_forward_logprobs_with_temperature_and_a_bare_model_equals_the_whole_logits():
    model = tiny(tied=False)
    ids = torch.randint(0, VOCAB, (3, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    new = forward_logprobs(model, ids, mask, chunk_size=4, temperature=0.7)
    old = old_forward_logprobs(model, ids, mask, temperature=0.7)
    torch.testing.assert_close(new, old, atol=1e-6, rtol=0)
    assert model.lm_head(torch.zeros(1, HIDDEN)).shape == (1, VOCAB)  # the head is restored


def test_reference_logprobs_equal_its_whole_log_softmax():
    engine = TrainEngine(tiny(tied=True), TrainConfig(lr=1e-2), reference=True)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    got = engine.reference.logprobs(ids, mask, chunk_size=4)
    assert got.shape == (2, 8) and not got.requires_grad
    expected = old_reference_logprobs(engine.reference, ids, mask)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


class LargestVocabTensor(TorchDispatchMode):
    """Records, over every op's outputs (forward and backward), the most rows a tensor with a
    vocabulary dimension has (numel / V), the head's weight-shaped [V, H] / [H, V] aside."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if (
                isinstance(t, torch.Tensor)
                and VOCAB in t.shape
                and sorted(t.shape) != sorted((VOCAB, HIDDEN))
            ):
                self.rows = max(self.rows, t.numel() // VOCAB)
        return out


@pytest.mark.parametrize("old", [False, True])
def test_no_tensor_with_a_vocabulary_dimension_exceeds_one_chunk(old, monkeypatch):
    """The largest vocabulary-sized tensor of an update (policy, reference, backward) is
    [chunk, V]; the old path's whole logits [B, T, V] are caught by the same probe."""
    if old:
        use_old_path(monkeypatch)
    chunk = 8
    probe = LargestVocabTensor()
    with probe:
        update(tied=True, kl_coef=0.5, chunk=chunk, n=4, mbs=4)
    if old:
        assert probe.rows > 4 * chunk  # [4, T, V] with T >= 9
    else:
        assert 0 < probe.rows <= chunk


def test_a_lora_head_or_a_soft_capped_model_is_refused():
    model = tiny(tied=False)
    model.config.final_logit_softcapping = 30.0
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        forward_logprobs(model, ids, ids)
    model = tiny(tied=False)
    model.lm_head = torch.nn.Sequential(model.lm_head)
    with pytest.raises(ValueError, match="not a plain nn.Linear"):
        forward_logprobs(model, ids, ids)


SCRIPT = Path(__file__).parent / "scripts" / "ds_policy_update.py"
_spec = importlib.util.spec_from_file_location("ds_policy_update", SCRIPT)
ds_policy_update = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ds_policy_update)


@pytest.mark.slow
def test_two_deepspeed_ranks_zero2_and_zero3_match_the_single_process_update(
    tmp_path, launch_two_ranks
):
    """ZeRO-3 partitions the tied head: its weight is gathered inside the head's own call for
    the chunked projection and again for the recomputing backward, the gradient reduced into
    the partition. Weights after two updates equal one process running both ranks' batches
    (under ZeRO-2 also with each micro-batch's prompt forwarded once: two forwards a backward;
    under ZeRO-3 also with zero-advantage rows left out of the forwards, a rank's micro-batch
    down to one row)."""
    run = launch_two_ranks([str(SCRIPT), "--out", str(tmp_path)], one_thread=False)
    output = run.stdout[-20000:] + run.stderr[-20000:]
    assert run.returncode == 0, output
    assert "rank 0: ok" in output and "rank 1: ok" in output, output
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    per_rank = ds_policy_update.PER_RANK // ds_policy_update.MICRO
    for name, (_, lora, share, zero_rows) in ds_policy_update.CONFIGS.items():
        engine = ds_policy_update.build_engine(lora, zero_stage=2, grad_accum=2 * per_rank)
        stats = []
        for step in range(ds_policy_update.STEPS):
            batches = [
                ds_policy_update.rank_batch(rank, step, share, zero_rows) for rank in range(2)
            ]
            trajs = [t for b in batches for t in b[0]]
            advantages = torch.cat([b[1] for b in batches])
            loss = ds_policy_update.loss_config(share, zero_rows)
            stats.append(policy_update(engine, trajs, advantages, loss, 0))
        ds = result[name]
        assert [s["grad_norm"] for s in ds["stats"]] == pytest.approx(
            [s["grad_norm"] for s in stats], rel=1e-5
        ), name
        gaps = [s["logprob_gap"] for s in ds["reduced"]]
        assert all(math.isfinite(g) and g > 0 for g in gaps), (name, gaps)
        if zero_rows:  # rows 0 and 3 of each rank's batch; rank 1's first: none (stand-ins)
            assert [s["update_rows"] for s in ds["stats"]] == [2, 2], name
            assert [s["update_rows"] for s in stats] == [2, 4], name
            # rank 1 forwarded no sampled token at step 0: the mean is rank 0's alone
            assert gaps[0] == pytest.approx(ds["stats"][0]["logprob_gap"], rel=1e-12), name
        else:
            assert ds["stats"][-1]["kl"] > 0, name
        state = export_hf_state_dict(engine, adapter="policy" if lora else None)
        assert list(state) == list(ds["state"]), name
        # Adam's first step is lr·g/(|g| + ε): on the paired batch one near-zero gradient entry
        # of gate_proj moves by 1.2e-6 between two ranks and one process, shared prompt or not
        atol = 1e-5 if share else 1e-6
        for key, value in state.items():
            torch.testing.assert_close(
                ds["state"][key],
                value,
                atol=atol,
                rtol=0,
                msg=lambda m, k=key, n=name: f"{n} {k}: {m}",
            )
