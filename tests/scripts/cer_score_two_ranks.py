"""Two DeepSpeed ranks score different CER groups with `hf_prefix_scorer` on a ZeRO-3 model.

Launched by tests/cer/test_cer_scorer.py as `deepspeed --num_gpus 2 cer_score_two_ranks.py`. The
ranks score different numbers of groups (rank 0 three, rank 1 one), so they need different
numbers of forwards; `sync_ranks=True` pads the shorter rank. Each rank checks its values against
the same scorer on a full, unpartitioned copy of the model and prints "rank R: ok".
"""

from __future__ import annotations

import argparse
import copy

import torch
import transformers

from cer.scorer import hf_prefix_scorer
from common.train import TrainConfig, TrainEngine


def groups(rank: int) -> tuple[list[list[int]], list[list[int]]]:
    """Pairs of 3 groups (rank 0) or 1 group (rank 1): 4 solutions of a prompt, 3 answers each."""
    gen = torch.Generator().manual_seed(10 + rank)
    prefixes, conts = [], []
    for _ in range(3 if rank == 0 else 1):
        prompt = torch.randint(1, 97, (12,), generator=gen).tolist()
        answers = [torch.randint(1, 97, (n,), generator=gen).tolist() for n in (2, 1, 3)]
        for n in (5, 7, 3, 6):
            prefix = prompt + torch.randint(1, 97, (n,), generator=gen).tolist()
            for a in answers:
                prefixes.append(prefix)
                conts.append(a)
    return prefixes, conts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    parser.parse_args()
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config)
    full = copy.deepcopy(model).eval()
    train = TrainEngine(model, TrainConfig(zero_stage=3, total_steps=1))
    assert any(hasattr(p, "ds_id") for p in train.model.parameters()), "not partitioned"
    prefixes, conts = groups(train.rank)
    got = hf_prefix_scorer(train.model, batch_size=2, sync_ranks=True)(prefixes, conts)
    want = hf_prefix_scorer(full, batch_size=2)(prefixes, conts)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w) and all(abs(a - b) < 1e-5 for a, b in zip(g, w, strict=True))
    print(f"rank {train.rank}: ok ({len(prefixes)} pairs)", flush=True)


if __name__ == "__main__":
    main()
