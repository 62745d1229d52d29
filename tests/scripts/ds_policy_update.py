"""Two DeepSpeed ranks run `common.rl_loop.policy_update` (chunked head log-probs, k3 KL to the
reference) under ZeRO-2 and ZeRO-3 on a tiny Qwen3 with tied embeddings, and under ZeRO-3 on its
LoRA model, under ZeRO-2 with `loss.share_prompt` (each micro-batch one prompt's two
responses, its prompt forwarded once), and under ZeRO-3 without a KL term on advantages that are
0 in some rows (`loss.skip_zero_advantage` leaves them out of the forward; one rank's first batch
all 0: each of its micro-batches forwards a two-token stand-in, and its `logprob_gap`, NaN, is
left out of the ranks' mean), each from the same weights on rank-dependent trajectories.

Launched by tests/test_policy_update_memory.py as `deepspeed --num_gpus 2 ds_policy_update.py
--out DIR`; rank 0 writes DIR/result.pt (each configuration's weights after STEPS updates and
their statistics) for the test to replay on the single-process path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

from common.rl_loop import LossConfig, all_ranks_mean, policy_update
from common.rollout.trajectory import Trajectory
from common.train import TrainConfig, TrainEngine, build_lora_model, export_hf_state_dict
from common.train.distributed import exit_process

VOCAB, STEPS, PER_RANK, MICRO = 97, 2, 4, 2
# name: (ZeRO stage, LoRA, loss.share_prompt, zero-advantage rows and no KL term)
CONFIGS = {
    "zero2": (2, False, False, False),
    "zero3": (3, False, False, False),
    "zero3_lora": (3, True, False, False),
    "zero2_shared_prompt": (2, False, True, False),
    "zero3_zero_advantage": (3, False, False, True),
}


def loss_config(share_prompt: bool, zero_rows: bool = False) -> LossConfig:
    return LossConfig(
        micro_batch_size=MICRO,
        kl_coef=0.0 if zero_rows else 0.5,
        logprob_chunk=5,
        aggregation="token_mean",
        share_prompt=share_prompt,
    )


def build_model(lora: bool) -> torch.nn.Module:
    """The tiny Qwen3 with tied embeddings, or with a LoRA adapter on its frozen backbone."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    model = transformers.Qwen3ForCausalLM(config)
    if not lora:
        return model
    adapter = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = build_lora_model(model, {"policy": adapter})
    generator = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: the adapted policy would equal its reference
            torch.nn.init.normal_(param, std=0.1, generator=generator)
    return model


def build_engine(lora: bool, zero_stage: int, grad_accum: int) -> TrainEngine:
    config = TrainConfig(lr=1e-2, grad_accum=grad_accum, max_grad_norm=1.0, zero_stage=zero_stage)
    engine = TrainEngine(build_model(lora), config, reference=True)
    if lora:
        engine.set_adapter("policy")
    return engine


def rank_batch(
    rank: int, step: int, paired: bool = False, zero_rows: bool = False
) -> tuple[list[Trajectory], torch.Tensor]:
    """PER_RANK trajectories of uneven lengths (some tokens inserted) and their advantages;
    ``paired``: trajectories 2k and 2k + 1 answer one prompt (a micro-batch of MICRO = 2 is one
    group); ``zero_rows``: advantages 0 in rows 1 and 2, and in every row of rank 1's first
    batch."""
    g = torch.Generator().manual_seed(100 * rank + step)
    trajs = []
    for i in range(PER_RANK):
        p, r = (int(x) for x in torch.randint(2, 7, (2,), generator=g))
        if i % 2 == 0 or not paired:
            prompt = torch.randint(1, VOCAB, (p,), generator=g).tolist()
        t = Trajectory("g", i, "q", "q", ["a"], list(prompt))
        t.append(torch.randint(1, VOCAB, (r,), generator=g).tolist(), True, [0.0] * r)
        t.append(torch.randint(1, VOCAB, (2,), generator=g).tolist(), False)
        trajs.append(t)
    advantages = torch.randn(PER_RANK, generator=g)
    if zero_rows:
        advantages[1:3] = 0
        if rank == 1 and step == 0:
            advantages[:] = 0
    return trajs, advantages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()
    result = {}
    for name, (zero_stage, lora, share, zero_rows) in CONFIGS.items():
        engine = build_engine(lora, zero_stage, grad_accum=PER_RANK // MICRO)
        assert engine.world_size == 2, engine.world_size
        loss = loss_config(share, zero_rows)
        batches = [rank_batch(engine.rank, s, share, zero_rows) for s in range(STEPS)]
        stats = [policy_update(engine, *batch, loss, 0) for batch in batches]
        state = export_hf_state_dict(engine, adapter="policy" if lora else None)
        reduced = [all_ranks_mean({"logprob_gap": s["logprob_gap"]}, PER_RANK) for s in stats]
        result[name] = {"state": state, "stats": stats, "reduced": reduced}
        print(f"rank {engine.rank} {name}: {stats}", flush=True)
    if dist.get_rank() == 0:
        torch.save(result, args.out / "result.pt")
    dist.barrier()
    print(f"rank {dist.get_rank()}: ok", flush=True)


if __name__ == "__main__":
    exit_process(main())
