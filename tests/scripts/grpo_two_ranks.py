"""Two DeepSpeed ranks, each with its own colocated vLLM engine, run GRPO steps on a tiny world.

Launched by tests/test_grpo.py with the DeepSpeed launcher. Each rank checks that all ranks end
with identical weights, different from the initial ones, and prints "rank R: ok".
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from common.config import load_config
from common.search_grpo import GRPOConfig, train_grpo
from common.train.distributed import exit_process


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the launcher
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(GRPOConfig, args.config, args.overrides)
    out = train_grpo(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    final = AutoModelForCausalLM.from_pretrained(f"{cfg.run_dir}/checkpoints/step_{cfg.steps}")
    initial = AutoModelForCausalLM.from_pretrained(cfg.path("model"))
    mine = flat_weights(out["model"])
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    assert all(torch.equal(gathered[0], g) for g in gathered), "ranks disagree"
    assert torch.equal(mine, flat_weights(final)), "checkpoint differs from the live weights"
    assert not torch.equal(mine, flat_weights(initial)), "weights did not move"
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    exit_process(main())
