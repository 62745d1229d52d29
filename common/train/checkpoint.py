"""Checkpoints that are both Hugging Face models and exact resume points, committed atomically.

    run_dir/checkpoints/
      latest                   "step_<N>", replaced atomically after each commit
      step_<N>/
        config.json, model*.safetensors, tokenizer files   full model, or LoRA merged (optional)
        adapters/<name>/                                   LoRA adapters (peft save_pretrained)
        state/                                             optimizer, schedule, trainable weights
                                                           (DeepSpeed shards under DeepSpeed),
                                                           rng_rank<r>.pt per rank
        trainer_state.json                                 global step, world size, data position
        COMPLETE                                           written last, before the rename

Everything is written into `step_<N>.tmp-<pid>` and renamed into place, so a crash never leaves
a half-written folder under a final name.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.train.distributed import barrier, broadcast_object
from common.train.engine import TrainEngine
from common.train.export import export_hf_state_dict
from common.train.lora import is_lora_model

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"step_(\d+)")


def save_checkpoint(
    engine: TrainEngine,
    run_dir: str | Path,
    step: int,
    data_state: dict[str, Any],
    keep_last: int | None = None,
    tokenizer: Any = None,
    merge_adapter: str | None = None,
) -> Path:
    """Write checkpoint `step` (all ranks must call) and return its folder.

    data_state: JSON-serialisable position of the data stream, returned by load_checkpoint.
    keep_last: keep this many newest checkpoints (None: all). merge_adapter: for LoRA models,
    also write the model merged with this adapter as a plain HF model.
    """
    if engine.pending_micro_batches:
        raise ValueError(
            f"save_checkpoint: gradient of {engine.pending_micro_batches} micro-batches not yet "
            f"stepped (grad_accum={engine.config.grad_accum}); save after an optimizer step"
        )
    if keep_last is not None and keep_last < 1:
        raise ValueError(f"save_checkpoint: keep_last={keep_last}; must be >= 1 or None")
    try:
        data_json = json.dumps(data_state)
    except (TypeError, ValueError) as err:
        raise ValueError(f"save_checkpoint: data_state is not JSON-serialisable: {err}") from None
    rng = _rng_state()  # restored at the end: saving must not change the run's random stream
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    tmp = Path(broadcast_object(str(root / f"step_{step}.tmp-{os.getpid()}")))
    if engine.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # our own leftover from a failed earlier save
        (tmp / "state").mkdir(parents=True)
    barrier()

    _write_hf_weights(engine, tmp, tokenizer, merge_adapter)
    engine.save_state(tmp / "state")
    torch.save(rng, tmp / "state" / f"rng_rank{engine.rank}.pt")
    barrier()
    if engine.is_main:
        trainer_state = {
            "step": step,
            "global_step": engine.global_step,
            "world_size": engine.world_size,
            "data_state": json.loads(data_json),
        }
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        (tmp / COMPLETE).write_text("")
        _commit(tmp, final)
        _replace_text(root / "latest", final.name)
        _prune(root, keep_last, keep=final)
    barrier()
    _set_rng_state(rng)
    return final


def find_latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint named by `latest`, else the complete one with the highest step."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.is_file():
        named = root / pointer.read_text().strip()
        if _STEP_DIR.fullmatch(named.name) and (named / COMPLETE).is_file():
            return named
    complete = _complete_checkpoints(root)
    return complete[-1] if complete else None


def load_checkpoint(engine: TrainEngine, path: str | Path) -> dict[str, Any]:
    """Restore weights, optimizer, schedule, RNGs and global step from `path` (all ranks must
    call); return the data_state given to save_checkpoint."""
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise ValueError(f"{path}: not a complete checkpoint (no {COMPLETE} marker)")
    state_file = path / "trainer_state.json"
    try:
        trainer_state = json.loads(state_file.read_text())
        world_size, global_step = trainer_state["world_size"], trainer_state["global_step"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{state_file}: unreadable trainer state: {err!r}") from None
    if world_size != engine.world_size:
        raise ValueError(
            f"{path}: written by {world_size} ranks, loading into {engine.world_size}; "
            "resume with the same number of ranks"
        )
    engine.load_state(path / "state")
    rng_file = path / "state" / f"rng_rank{engine.rank}.pt"
    _set_rng_state(torch.load(rng_file, weights_only=False))
    engine.global_step = global_step
    barrier()
    return trainer_state["data_state"]


def _write_hf_weights(
    engine: TrainEngine, folder: Path, tokenizer: Any, merge_adapter: str | None
) -> None:
    """HF model (full, or LoRA merged with merge_adapter) and LoRA adapters; gathers are collective."""
    model = engine.model
    if hasattr(model, "write_checkpoint_files"):  # a composite model writes its own (ARCO's)
        model.write_checkpoint_files(folder, engine.is_main)
        if tokenizer is not None and engine.is_main:
            tokenizer.save_pretrained(folder)
        return
    lora = is_lora_model(model)
    if lora and merge_adapter is not None and merge_adapter not in model.peft_config:
        raise ValueError(
            f"save_checkpoint: no adapter {merge_adapter!r}; have {sorted(model.peft_config)}"
        )
    if not lora and not hasattr(model, "save_pretrained"):
        raise ValueError(f"save_checkpoint: {type(model).__name__} has no save_pretrained (not HF)")
    if not lora or merge_adapter is not None:
        state = export_hf_state_dict(engine, merge_lora=True, adapter=merge_adapter)
        hf_model = model.get_base_model() if lora else model
        if engine.is_main:
            hf_model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    if lora:
        lora_state = _lora_state_dict(engine)
        if engine.is_main:
            model.save_pretrained(
                folder / "adapters",
                state_dict=lora_state,
                selected_adapters=list(model.peft_config),
                safe_serialization=True,
            )
    if tokenizer is not None and engine.is_main:
        tokenizer.save_pretrained(folder)


def _lora_state_dict(engine: TrainEngine) -> dict[str, torch.Tensor]:
    """LoRA weights of every adapter on CPU, peft names; gathered under ZeRO-3."""
    params = [(n, p) for n, p in engine.model.named_parameters() if "lora_" in n]
    partitioned = [p for _, p in params if hasattr(p, "ds_id")]
    if partitioned:
        import deepspeed

        with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
            return {n: p.detach().to("cpu", copy=True) for n, p in params}
    return {n: p.detach().to("cpu", copy=True) for n, p in params}


def _commit(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an existing final (a re-save of the same step) is moved aside first."""
    aside = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, aside)
    os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _complete_checkpoints(root: Path) -> list[Path]:
    """Complete step_<N> folders, oldest first."""
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.fullmatch(p.name)) and (p / COMPLETE).is_file()
    ]
    return [p for _, p in sorted(found)]


def _prune(root: Path, keep_last: int | None, keep: Path) -> None:
    """Drop leftovers of crashed saves and all but the newest keep_last checkpoints."""
    for leftover in root.glob("step_*.*-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    if keep_last is None:
        return
    complete = _complete_checkpoints(root)
    for old in complete[: max(len(complete) - keep_last, 0)]:
        if old != keep:
            shutil.rmtree(old)


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
