"""Two DeepSpeed ranks, a non-finite value that only rank 1 sees: both ranks skip the same
optimizer updates, and the weights, the optimizer state and the learning rate stay bit for bit
as they were.

Per ZeRO stage (``--stages``), four ``common.rl_loop.policy_update`` calls on a tiny Qwen3:
  1. applied;
  2. a NaN advantage on rank 1 (``policy_update``'s all-reduced check, before any forward);
  3. a NaN loss in rank 1's second micro-batch (``TrainEngine.backward`` makes its gradients
     NaN; DeepSpeed's own skip of a non-finite global norm, or the engine's under stage 0);
  4. applied.

Launched by tests/test_guards.py as `deepspeed --num_gpus 2 ds_guards.py --out DIR`; each rank
writes DIR/rank<r>.pt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ds_policy_update import MICRO, PER_RANK, build_model, rank_batch

import common.rl_loop as rl_loop
from common.rl_loop import LossConfig, policy_update
from common.train import TrainConfig, TrainEngine, export_hf_state_dict
from common.train.distributed import current_rank, exit_process

LOSS = LossConfig(micro_batch_size=MICRO, logprob_chunk=5, aggregation="token_mean")


def build_engine(zero_stage: int) -> TrainEngine:
    """A decaying schedule and weight decay: a step taken on zero gradients would still move
    the weights and the rate."""
    config = TrainConfig(
        lr=1e-2,
        grad_accum=PER_RANK // MICRO,
        max_grad_norm=1.0,
        zero_stage=zero_stage,
        scheduler="linear",
        total_steps=10,
        weight_decay=0.1,
    )
    return TrainEngine(build_model(lora=False), config)


def optimizer_tensors(train: TrainEngine) -> list[torch.Tensor]:
    """AdamW's tensors on this rank: its (fp32, partitioned under ZeRO) weights and its state."""
    basic = train._backend.engine.basic_optimizer
    tensors = [p for g in basic.param_groups for p in g["params"]]
    tensors += [v for s in basic.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.detach().clone() for t in tensors]


def snapshot(train: TrainEngine) -> dict:
    return {
        "weights": export_hf_state_dict(train, rank0_only=False),  # gathered on every rank
        "optimizer": optimizer_tensors(train),
        "lr": train.lr,
    }


def equal(a: dict, b: dict) -> dict[str, bool]:
    return {
        "weights": a["weights"].keys() == b["weights"].keys() != set()
        and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"]),
        "optimizer": len(a["optimizer"]) == len(b["optimizer"]) > 0
        and all(torch.equal(x, y) for x, y in zip(a["optimizer"], b["optimizer"], strict=True)),
        "lr": a["lr"] == b["lr"],
    }


def nan_loss_on(rank: int, micro_batch: int):
    """``aggregate_loss`` that returns NaN on ``rank``'s ``micro_batch``-th call (1-based)."""
    real, calls = rl_loop.aggregate_loss, [0]

    def aggregate(*args, **kwargs):
        calls[0] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if current_rank() == rank and calls[0] == micro_batch else loss

    return aggregate


def run_stage(zero_stage: int) -> dict:
    train = build_engine(zero_stage)
    assert train.world_size == 2, train.world_size
    rank = train.rank
    out: dict = {"skips": [], "stats": [], "global_step": []}

    def update(step: int, advantages: torch.Tensor | None = None) -> None:
        trajs, adv = rank_batch(rank, step)
        stats = policy_update(train, trajs, adv if advantages is None else advantages, LOSS, 0)
        out["stats"].append(stats)
        out["skips"].append(train.take_skips())
        out["global_step"].append(train.global_step)

    update(0)
    before = snapshot(train)
    adv = rank_batch(rank, 1)[1]
    if rank == 1:
        adv[2] = float("nan")
    update(1, adv)
    out["after_nan_advantage"] = equal(before, snapshot(train))
    real = rl_loop.aggregate_loss
    rl_loop.aggregate_loss = nan_loss_on(rank=1, micro_batch=2)
    try:
        update(2)
    finally:
        rl_loop.aggregate_loss = real
    out["after_nan_loss"] = equal(before, snapshot(train))
    update(3)
    out["after_finite_update"] = equal(before, snapshot(train))
    out["skipped_updates"] = train.skipped_updates
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3, 0])
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    result = {}
    for stage in args.stages:
        t0 = time.perf_counter()
        result[stage] = run_stage(stage)
        result[stage]["seconds"] = time.perf_counter() - t0
    torch.save(result, args.out / f"rank{dist.get_rank()}.pt")
    dist.barrier()
    print(f"rank {dist.get_rank()}: ok", flush=True)


if __name__ == "__main__":
    exit_process(main())
