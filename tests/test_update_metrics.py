"""What TRL and verl users look for in a step's metrics, from ``policy_update`` (GRPO,
EviBack, CER) on a tiny model: ``entropy`` (mean over the sampled tokens the update forwarded,
from its own forward), ``lr`` (the rate of the optimizer step), ``clip_frac``, and
``response_length/mean`` and ``/max``; ``response_length/max`` is the maximum over ranks."""

from __future__ import annotations

import math

import pytest
import torch

from common.rl_loop import LossConfig, all_ranks_mean, policy_update
from common.rollout.trajectory import Trajectory
from common.train import TrainConfig, TrainEngine
from tests.test_shared_prompt import groups, tiny


def sampled_entropy(model: torch.nn.Module, trajs: list[Trajectory]) -> float:
    """Mean over every sampled token of H(π(· | its prefix)), one plain forward a row."""
    total, count = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)  # [T, V]
            h = -(logp.exp() * logp).sum(-1)  # [T]
            p = len(t.prompt_ids)
            for j, keep in enumerate(t.loss_mask):  # token p + j is predicted at p + j - 1
                if keep:
                    total += float(h[p + j - 1])
                    count += 1
    return total / count


@pytest.mark.parametrize("share", [False, True])
def test_policy_update_logs_entropy_lr_clip_fraction_and_response_lengths(share):
    trajs = groups([6, 4])  # 6 rows; one without a response, two with an inserted span
    engine = TrainEngine(tiny("llama", seed=3), TrainConfig(lr=1e-2, grad_accum=2))
    want_entropy = sampled_entropy(engine.model, trajs)  # one optimizer step: the same weights
    advantages = torch.randn(len(trajs), generator=torch.Generator().manual_seed(7))
    cfg = LossConfig(micro_batch_size=3, logprob_chunk=5, share_prompt=share)
    stats = policy_update(engine, trajs, advantages, cfg, pad_id=0)
    assert stats["entropy"] == pytest.approx(want_entropy, rel=1e-5)
    assert 0 < stats["entropy"] < math.log(97)
    assert stats["lr"] == 1e-2  # the rate the step used (constant schedule)
    assert stats["clip_frac"] == 0.0  # on-policy: every ratio is 1
    lengths = [len(t.response_ids) for t in trajs]
    assert 0 in lengths
    assert stats["response_length/mean"] == sum(lengths) / 6
    assert stats["response_length/max"] == max(lengths)


def test_a_skipped_update_logs_the_same_keys():
    trajs = groups([6, 4])
    engine = TrainEngine(tiny("llama", seed=3), TrainConfig(lr=1e-2, grad_accum=2))
    bad = torch.full((len(trajs),), float("nan"))
    cfg = LossConfig(micro_batch_size=3, logprob_chunk=5)
    stats = policy_update(engine, trajs, bad, cfg, pad_id=0)
    assert math.isnan(stats["entropy"]) and stats["lr"] == 1e-2
    assert stats["response_length/max"] == max(len(t.response_ids) for t in trajs)


def _two_ranks(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        metrics = {"response_length/max": [7.0, 3.0][rank], "response_length/mean": [4.0, 2.0][rank],
                   "tokens/update": [10.0, 5.0][rank]}  # fmt: skip
        out.put((rank, all_ranks_mean(metrics, weight=[1, 3][rank])))
    finally:
        dist.destroy_process_group()


def test_the_longest_response_is_the_maximum_over_ranks(free_port):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_two_ranks, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for rank in (0, 1):
        assert got[rank]["response_length/max"] == 7.0
        assert got[rank]["response_length/mean"] == pytest.approx((4.0 * 1 + 2.0 * 3) / 4)
        assert got[rank]["tokens/update"] == 15.0
