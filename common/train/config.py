"""The optimisation settings of a training run, shared by every method's trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # a config module: torch loads in the two methods that need it
    import torch

SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


@dataclass
class TrainConfig:
    """AdamW, its learning-rate schedule, and how gradients are accumulated, clipped and sharded."""

    lr: float = field(default=1e-6, metadata={"help": "peak learning rate of AdamW", "gt": 0})
    weight_decay: float = field(
        default=0.0, metadata={"help": "AdamW decoupled weight decay", "ge": 0}
    )
    betas: tuple[float, float] = field(
        default=(0.9, 0.999), metadata={"help": "AdamW (beta1, beta2)", "ge": 0, "lt": 1}
    )
    warmup_steps: int = field(
        default=0, metadata={"help": "optimizer steps of linear warmup from 0 to lr", "ge": 0}
    )
    scheduler: Literal["constant", "linear", "cosine"] = field(
        default="constant",
        metadata={
            "help": "lr after warmup: constant, or linear / cosine decay to 0 at total_steps"
        },
    )
    total_steps: int = field(
        default=1000,
        metadata={"help": "optimizer steps of the run; decay schedules end here", "ge": 1},
    )
    grad_accum: int = field(
        default=1, metadata={"help": "micro-batches (backward calls) per optimizer step", "ge": 1}
    )
    max_grad_norm: float = field(
        default=1.0,
        metadata={"help": "clip the global gradient L2 norm to this; 0 disables", "ge": 0},
    )
    zero_stage: int = field(
        default=2,
        metadata={"help": "DeepSpeed ZeRO stage (0-3) when world size > 1", "ge": 0, "le": 3},
    )
    bf16: bool | Literal["auto"] = field(
        default="auto",
        metadata={"help": "bf16 weights with fp32 master weights; auto: on GPU only"},
    )
    seed: int = field(
        default=0,
        metadata={"help": "seed of python, numpy and torch RNGs set by the engine", "ge": 0},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward to save memory"}
    )

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives a list
        checks = {
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "betas": len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            "warmup_steps": self.warmup_steps >= 0,
            "scheduler": self.scheduler in SCHEDULERS,
            "total_steps": self.total_steps >= 1,
            "grad_accum": self.grad_accum >= 1,
            "max_grad_norm": self.max_grad_norm >= 0,
            "zero_stage": self.zero_stage in (0, 1, 2, 3),
            "bf16": self.bf16 in (True, False, "auto"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"TrainConfig: invalid {values} (see the field help)")

    def use_bf16(self, device: torch.device) -> bool:
        """Resolve `bf16`: "auto" means bf16 on a CUDA device that supports it, fp32 elsewhere."""
        if self.bf16 == "auto":
            import torch

            return device.type == "cuda" and torch.cuda.is_bf16_supported()
        return bool(self.bf16)

    def weights_dtype(self) -> torch.dtype:
        """The dtype ``TrainEngine`` holds a fully trained model's weights in on this process's
        device (CUDA where there is one): bf16 under ``use_bf16``, else fp32."""
        import torch

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.bfloat16 if self.use_bf16(device) else torch.float32
