"""Two DeepSpeed ranks: `cer train` on the tiny task, then ZeRO-3 scoring of uneven groups.

Launched once by tests/cer/test_cer_run.py, one start of the ranks for both two-rank checks:

    deepspeed --num_gpus 2 cer_two_ranks.py --config cer/configs/tiny.yaml OVERRIDES...

Training: the `cer train` command line (``cer.cli.main``) on the overrides; after every step
(``common.run.Run.end_of_step``, where the run's evaluations and checkpoints happen) each rank
prints a digest of its live weights, ``rank R step S weights SHA``, and checks that every rank
has the same one (the initial weights print as step 0).

Scoring: the ranks score different CER groups with ``hf_prefix_scorer`` on a ZeRO-3 model (rank 0
three groups, rank 1 one), so they need different numbers of forwards; ``sync_ranks=True`` pads
the shorter rank. Each rank checks its values against the same scorer on a full, unpartitioned
copy of the model and prints ``rank R: scoring ok (N pairs)``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib

import torch
import torch.distributed as dist
import transformers

import cer.trainer
import common.run
from cer.cli import main as cer_main
from cer.rewards.scoring import hf_prefix_scorer
from common.train import TrainConfig, TrainEngine
from common.train.distributed import exit_process


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def check_same_weights(step: int, model: torch.nn.Module) -> None:
    """Print this rank's weight digest and check that every rank has the same (a collective)."""
    mine = digest(model)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    print(f"rank {dist.get_rank()} step {step} weights {mine}", flush=True)
    assert len(set(every)) == 1, f"step {step}: ranks disagree on the weights: {every}"


def train_checking_weights(argv: list[str]) -> int:
    """``cer train`` with the weights compared across ranks before the first and after each
    step."""
    end_of_step = common.run.Run.end_of_step
    make_score_fn = cer.trainer.make_score_fn

    def first(cfg, engine, model, *rest, **kw):  # built once, after the engine wraps the model
        check_same_weights(0, model)
        return make_score_fn(cfg, engine, model, *rest, **kw)

    def after(run, step):
        end_of_step(run, step)
        check_same_weights(step, run.train.model)

    cer.trainer.make_score_fn, common.run.Run.end_of_step = first, after
    try:
        return cer_main(["train", *argv])
    finally:
        cer.trainer.make_score_fn, common.run.Run.end_of_step = make_score_fn, end_of_step


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


def zero3_scoring() -> None:
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
    print(f"rank {train.rank}: scoring ok ({len(prefixes)} pairs)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    _, train_argv = parser.parse_known_args()
    code = train_checking_weights(train_argv)
    if code:
        return code
    zero3_scoring()
    return 0


if __name__ == "__main__":
    exit_process(main())
