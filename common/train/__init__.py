"""The training engine: DeepSpeed or plain torch, LoRA adapters, reference model, checkpoints, logs."""

from common.train.checkpoint import find_latest_checkpoint, load_checkpoint, save_checkpoint
from common.train.config import TrainConfig
from common.train.engine import TrainEngine, load_for_training
from common.train.export import export_hf_state_dict, iter_named_weights
from common.train.logging import MetricsLogger, progress, read_metrics, write_env_json
from common.train.lora import build_lora_model
from common.train.reference import ReferenceModel

__all__ = [
    "MetricsLogger",
    "ReferenceModel",
    "TrainConfig",
    "TrainEngine",
    "build_lora_model",
    "export_hf_state_dict",
    "find_latest_checkpoint",
    "iter_named_weights",
    "load_for_training",
    "load_checkpoint",
    "progress",
    "read_metrics",
    "save_checkpoint",
    "write_env_json",
]
