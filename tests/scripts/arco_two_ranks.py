"""Two DeepSpeed ranks, each with its own colocated vLLM engine serving both LoRA adapters, run
ARCO's co-evolution RL (``train_arco``) from a warmup written beforehand by one process.

Launched by tests/arco/test_arco_two_ranks.py with the DeepSpeed launcher. Each rank checks that
all ranks end with identical trainable weights (policy adapter, rubric adapter, head; with a
frozen μ the policy adapter, the head staying the warmup's), that they moved from the warmup's,
and that the last checkpoint holds them; then prints
"rank R: ok <sha256 of its trainable weights>".
"""

from __future__ import annotations

import argparse
import hashlib

import torch
import torch.distributed as dist

from arco.config import ArcoConfig
from arco.rubric_model import build_arco_model
from arco.trainer import train_arco
from common.config import load_config
from common.train.distributed import exit_process


def trainable(model: torch.nn.Module) -> torch.Tensor:
    """The trained adapters and the head, flat, in name order."""
    named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
    assert named, "no trainable parameters"
    return torch.cat([p.detach().float().flatten() for _, p in named])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the launcher
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = load_config(ArcoConfig, args.config, args.overrides)
    out = train_arco(cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = trainable(out["model"])
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    assert all(torch.equal(gathered[0], g) for g in gathered), "ranks disagree"
    lora, k = cfg.lora.as_peft(), cfg.head_k
    warm = build_arco_model(cfg.assets.model, lora, k, cfg.warmup_dir)
    ckpt = build_arco_model(
        cfg.assets.model, lora, k, f"{cfg.run_dir}/checkpoints/step_{cfg.steps}"
    )
    if cfg.mu_frozen:  # frozen μ: compare what was trained; μ must be the warmup's
        torch.testing.assert_close(ckpt.head.state_dict(), warm.head.state_dict(), rtol=0, atol=0)
        for m in (warm, ckpt):
            m.freeze_rubric()
    assert not torch.equal(mine, trainable(warm)), "weights did not move"
    assert torch.equal(mine, trainable(ckpt)), "checkpoint differs from the live weights"
    digest = hashlib.sha256(mine.numpy().tobytes()).hexdigest()[:16]
    print(f"rank {rank}: ok {digest}", flush=True)


if __name__ == "__main__":
    exit_process(main())
