"""The training engine: DeepSpeed or plain torch, LoRA adapters, reference model, checkpoints, logs.

The names below load on first use (PEP 562): importing ``common.train.config`` (a config
module) does not load torch, transformers, peft or deepspeed.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "check_checkpoint_space": "common.train.checkpoint",
    "checkpoint_bytes": "common.train.checkpoint",
    "find_latest_checkpoint": "common.train.checkpoint",
    "load_checkpoint": "common.train.checkpoint",
    "planned_saves": "common.train.checkpoint",
    "save_checkpoint": "common.train.checkpoint",
    "TrainConfig": "common.train.config",
    "TrainEngine": "common.train.engine",
    "load_for_training": "common.train.engine",
    "export_hf_state_dict": "common.train.export",
    "iter_named_weights": "common.train.export",
    "MetricsLogger": "common.train.logging",
    "progress": "common.train.logging",
    "read_metrics": "common.train.logging",
    "write_env_json": "common.train.logging",
    "build_lora_model": "common.train.lora",
    "ReferenceModel": "common.train.reference",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'common.train' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
