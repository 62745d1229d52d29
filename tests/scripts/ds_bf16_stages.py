"""What the engine's DeepSpeed backend builds for a bf16 model at each ZeRO stage, on one rank.

Run by tests/test_train_engine.py as ``python ds_bf16_stages.py --out FILE`` with RANK=0,
WORLD_SIZE=1, LOCAL_RANK=0, MASTER_ADDR and MASTER_PORT set: a real DeepSpeed engine (CPU
accelerator, gloo) per stage over the tiny Qwen3 in bf16. FILE gets, per stage, the optimizer
class DeepSpeed built or the error the engine raised, the optimizer's gradient accumulation
dtype and overflow check, and, at stages 2 and 3, what a step on a NaN loss did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ds_two_ranks import tiny_qwen3  # noqa: E402

from common.train import TrainConfig  # noqa: E402
from common.train.distributed import exit_process, init_distributed  # noqa: E402
from common.train.engine import _DeepSpeedBackend, cast_parameters  # noqa: E402


def held(param: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``param``: its ZeRO-3 partition, else the whole tensor."""
    return (param.ds_tensor if hasattr(param, "ds_tensor") else param).detach()


def stage_report(stage: int) -> dict:
    model = tiny_qwen3()
    cast_parameters(model, torch.bfloat16)
    config = TrainConfig(
        zero_stage=stage, bf16=True, grad_accum=1, lr=1e-2, scheduler="linear", total_steps=10
    )
    try:
        backend = _DeepSpeedBackend(
            model, [{"name": "all", "params": list(model.parameters())}], config, True
        )
    except (ValueError, NotImplementedError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    optimizer = backend.engine.optimizer
    accum = getattr(optimizer, "gradient_accumulation_dtype", None)
    report = {
        "optimizer": type(optimizer).__name__,
        "grad_accum_dtype": str(accum) if accum is not None else None,
        "check_grad_overflow": getattr(optimizer, "check_grad_overflow", None),
    }
    # a NaN loss: DeepSpeed must skip the step (the weights and the schedule stay as they were)
    lr = backend.optimizer.param_groups[0]["lr"]
    before = [held(p).clone() for p in backend.engine.module.parameters()]
    ids = torch.arange(8).view(1, 8)
    loss = backend.forward(input_ids=ids, labels=ids).loss
    backend.backward(loss * float("nan"))
    norm, skipped = backend.step(True)
    after = [held(p) for p in backend.engine.module.parameters()]
    report["nan_step"] = {
        "skipped": skipped,
        "weights_kept": all(torch.equal(a, b) for a, b in zip(after, before, strict=True)),
        "lr_kept": backend.optimizer.param_groups[0]["lr"] == lr,
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank, world, _ = init_distributed()
    assert (rank, world) == (0, 1), (rank, world)
    args.out.write_text(json.dumps({stage: stage_report(stage) for stage in range(4)}, indent=1))


if __name__ == "__main__":
    exit_process(main())
