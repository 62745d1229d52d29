"""Two DeepSpeed ranks train the tiny Qwen3 for 3 optimizer steps on rank-dependent data.

Launched by tests/test_train_engine.py as `deepspeed --num_gpus 2 ds_two_ranks.py --zero-stage S
--out DIR [--lora] [--clip-sets] [--load MODEL]` (``--clip-sets``: the LoRA model with ARCO's
parameter groups, the policy and rubric adapters each in its own clip set; ``--load``: the tiny
Qwen3 saved in MODEL, loaded by ``load_for_training``, which under ZeRO-3 partitions it as it
loads: each rank checks that it never held more than its share) (on a CPU machine DeepSpeed's CPU accelerator runs the ranks over gloo). Each rank
checks that all ranks hold the same, changed weights, that a checkpoint round trip restores
weights and optimizer, and rank 0 writes DIR/result.pt with the batches it saw, for the test to
replay on the single-process path.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

from common.train import (
    TrainConfig,
    TrainEngine,
    build_lora_model,
    export_hf_state_dict,
    load_checkpoint,
    load_for_training,
    save_checkpoint,
)
from common.train.distributed import exit_process

STEPS, GRAD_ACCUM, BATCH, SEQ = 3, 2, 2, 8
CLIP_SETS_NORM = 0.1


def tiny_qwen3() -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return transformers.Qwen3ForCausalLM(config)


def build_model(lora: bool) -> torch.nn.Module:
    """The tiny Qwen3, or the tiny Qwen3 with ARCO's two adapters on its frozen backbone."""
    if not lora:
        return tiny_qwen3()
    adapter = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = build_lora_model(tiny_qwen3(), {"policy": adapter, "rubric": adapter})
    generator = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at 0, which would hide a wrong merge
            torch.nn.init.normal_(param, std=0.1, generator=generator)
    return model


def param_groups(model: torch.nn.Module, clip_sets: bool) -> list[dict] | None:
    """With ``clip_sets``: one group per adapter, each its own clip set, rubric at half the lr."""
    if not clip_sets:
        return None
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"name": a, "clip": a, "lr": lr, "params": [p for n, p in named if f".{a}." in n]}
        for a, lr in (("policy", 1e-2), ("rubric", 5e-3))
    ]


def loaded_partitioned(folder: Path, config: TrainConfig) -> torch.nn.Module:
    """The saved tiny Qwen3 through ``load_for_training``; under ZeRO-3 every parameter is
    already a partition of at most ceil(n / 2) values on this rank, its full tensor empty."""
    model = load_for_training(folder, config)
    if config.zero_stage == 3:
        for name, p in model.named_parameters():
            assert hasattr(p, "ds_id") and p.numel() == 0, name
            assert p.ds_tensor.numel() <= -(-p.ds_numel // 2), (name, p.ds_tensor.numel())
    return model


def build_engine(
    lora: bool,
    zero_stage: int,
    clip_sets: bool,
    grad_accum: int = GRAD_ACCUM,
    load: Path | None = None,
):
    """The engine the script trains (and the test replays on one process)."""
    config = train_config(zero_stage, grad_accum)
    model = loaded_partitioned(load, config) if load else build_model(lora or clip_sets)
    if clip_sets:  # a clip the adapters' gradients (norms 0.1-0.15) do reach
        config = dataclasses.replace(config, max_grad_norm=CLIP_SETS_NORM)
    return TrainEngine(model, config, param_groups=param_groups(model, clip_sets))


def micro_loss(engine: TrainEngine, ids: torch.Tensor, lora: bool) -> torch.Tensor:
    """Mean of two half-batch losses, each its own forward (ARCO: policy half, rubric half)."""
    losses = []
    for half, adapter in zip(ids.chunk(2), ("policy", "rubric"), strict=True):
        if lora:
            engine.set_adapter(adapter)
        losses.append(engine(input_ids=half, labels=half).loss)
    return sum(losses) / 2


def train_config(zero_stage: int, grad_accum: int = GRAD_ACCUM) -> TrainConfig:
    return TrainConfig(
        lr=1e-2,
        warmup_steps=1,
        scheduler="linear",
        total_steps=10,
        grad_accum=grad_accum,
        max_grad_norm=1.0,
        zero_stage=zero_stage,
    )


def micro_batch(rank: int, step: int, micro: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randint(0, 97, (BATCH, SEQ), generator=generator)


def train_step(engine: TrainEngine, step: int, lora: bool) -> list[dict]:
    infos = []
    for micro in range(GRAD_ACCUM):
        engine.backward(micro_loss(engine, micro_batch(engine.rank, step, micro), lora))
        infos.append(engine.step())
    return infos


def flat_weights(engine: TrainEngine, adapters: list[str | None]) -> torch.Tensor:
    """All weights, merged with each adapter in turn for LoRA models, as one vector."""
    flat = []
    for adapter in adapters:
        state = export_hf_state_dict(engine, adapter=adapter, rank0_only=False)
        flat += [state[name].flatten().float() for name in sorted(state)]
    return torch.cat(flat)


def assert_same_on_all_ranks(tensor: torch.Tensor, what: str) -> None:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    for rank, other in enumerate(gathered):
        assert torch.equal(other, tensor), (
            f"{what}: rank {rank} differs from rank {dist.get_rank()}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero-stage", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--clip-sets", action="store_true")
    parser.add_argument("--load", type=Path, default=None)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()

    args.lora = args.lora or args.clip_sets
    adapters = ["policy", "rubric"] if args.lora else [None]
    engine = build_engine(args.lora, args.zero_stage, args.clip_sets, load=args.load)
    assert engine.world_size == 2, engine.world_size
    initial = flat_weights(engine, adapters)
    assert_same_on_all_ranks(initial, "initial weights")

    infos = [info for step in range(STEPS) for info in train_step(engine, step, args.lora)]
    assert [i["stepped"] for i in infos] == [False, True] * STEPS, infos
    assert engine.global_step == STEPS
    trained = flat_weights(engine, adapters)
    assert_same_on_all_ranks(trained, "trained weights")
    assert not torch.equal(trained, initial), "weights did not change"
    trained_states = {a: export_hf_state_dict(engine, adapter=a) for a in adapters}  # rank 0 only

    run_dir = args.out / "run"
    merge = "policy" if args.lora else None
    save_checkpoint(engine, run_dir, STEPS, {"position": STEPS}, keep_last=1, merge_adapter=merge)
    train_step(engine, STEPS, args.lora)
    continued = flat_weights(engine, adapters)

    resumed_engine = build_engine(args.lora, args.zero_stage, args.clip_sets, load=args.load)
    data_state = load_checkpoint(resumed_engine, run_dir / "checkpoints" / f"step_{STEPS}")
    assert data_state == {"position": STEPS}, data_state
    assert resumed_engine.global_step == STEPS
    assert torch.equal(flat_weights(resumed_engine, adapters), trained), "loaded weights differ"
    train_step(resumed_engine, STEPS, args.lora)
    assert torch.equal(flat_weights(resumed_engine, adapters), continued), (
        "step after resume differs"
    )

    batches = [
        [micro_batch(rank, step, micro) for rank in range(2) for micro in range(GRAD_ACCUM)]
        for step in range(STEPS)
    ]
    if engine.is_main:
        result = {"states": trained_states, "infos": infos, "batches": batches}
        torch.save(result, args.out / "result.pt")
    dist.barrier()
    print(f"rank {engine.rank}: ok", flush=True)


if __name__ == "__main__":
    exit_process(main())
