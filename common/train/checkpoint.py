"""Checkpoints that are both Hugging Face models and exact resume points, committed atomically.

    run_dir/checkpoints/
      latest                   "step_<N>", replaced atomically after each commit
      step_<N>/
        config.json, model*.safetensors, tokenizer files   full model, or LoRA merged (optional)
        adapters/<name>/                                   LoRA adapters (peft save_pretrained)
        state/                                             optimizer, schedule, trainable weights
                                                           (train_state.json + .safetensors;
                                                           DeepSpeed shards under DeepSpeed),
                                                           rng_rank<r>.json (+ .safetensors)
        trainer_state.json                                 global step, world size, data position
        COMPLETE                                           written last, before the rename

Everything is written into `step_<N>.tmp-<pid>` and renamed into place, so a crash never leaves
a half-written folder under a final name. A save that fails while writing (the disk full: torch's
"PytorchStreamWriter failed writing file", safetensors' I/O error) removes its partial folder and
raises ``CheckpointSaveError`` naming the cause ("no space left on device"), the folder and the
free space; ``latest`` still names the previous checkpoint. Leftovers of a killed save are removed
before the next one writes. ``check_checkpoint_space`` says before training whether the kept
checkpoints fit (``checkpoint_bytes``: one checkpoint's size, estimated from the parameters).

Nothing a resume reads runs code (``common.train.plain_state``): the optimizer, schedule and
random streams are JSON and safetensors; an older checkpoint's ``train_state.pt`` and
``rng_rank<r>.pt`` are read with ``torch.load(weights_only=True)``, and one holding a pickle of
anything but tensors, plain containers and the numpy RNG's arrays is refused in one line.
DeepSpeed's own shards are read through a loader with ``weights_only=True`` too
(``common.train.engine``).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import math
import os
import random
import re
import shutil
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.jsonl import write_atomic
from common.train.distributed import barrier, broadcast_object
from common.train.engine import TrainEngine
from common.train.export import export_hf_state_dict
from common.train.lora import is_lora_model
from common.train.plain_state import exists, load_legacy_torch, load_plain, save_plain

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"step_(\d+)")
GIB = 2**30
SPACE_MARGIN = 1.5  # check_checkpoint_space warns when free space is under this many times need


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (its partial folder removed; ``latest`` unchanged)."""


class CheckpointSpaceError(ValueError):
    """Before training: the checkpoints the run keeps do not fit in the free disk space."""


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
    rng = rng_state()  # restored at the end: saving must not change the run's random stream
    root = Path(run_dir) / "checkpoints"
    final = root / f"step_{step}"
    tmp = Path(broadcast_object(str(root / f"step_{step}.tmp-{os.getpid()}")))
    try:
        if engine.is_main:
            # leftovers of a killed or failed earlier save (ours or another process's: the run
            # folder's lock says no other run writes here) would keep their disk space
            _remove_leftovers(root)
            (tmp / "state").mkdir(parents=True)
        barrier()

        _write_hf_weights(engine, tmp, tokenizer, merge_adapter)
        engine.save_state(tmp / "state")
        save_plain(tmp / "state" / f"rng_rank{engine.rank}", rng)
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
    except Exception as err:
        error = _failed_save(err, engine, step, tmp, root)
        if error is err:  # not an I/O failure (a bug): as it was, the partial folder removed
            raise
        raise error from err
    if engine.is_main:
        _commit(tmp, final)
        write_atomic(root / "latest", final.name + "\n")
        _prune(root, keep_last, keep=final)
    barrier()
    set_rng_state(rng)
    return final


def _failed_save(
    err: Exception, engine: TrainEngine, step: int, tmp: Path, root: Path
) -> Exception:
    """The partial folder removed; the error to raise: a ``CheckpointSaveError`` naming the
    cause, the folder and the free space for an I/O failure (``OSError``, torch's
    ``RuntimeError``, or any error while the disk is full), else ``err`` itself."""
    written = _folder_bytes(tmp)
    free_then = _free_bytes(root)
    previous = find_latest_checkpoint(root.parent)
    # what this checkpoint takes: the last one's size, else the estimate from the parameters
    needed = _folder_bytes(previous) if previous is not None else checkpoint_bytes(engine)
    code = getattr(err, "errno", None)
    no_space = (
        code == errno.ENOSPC
        or "no space left" in str(err).lower()
        or (code is None and free_then is not None and free_then + written < needed)
    )
    if not no_space and not isinstance(err, OSError | RuntimeError):
        shutil.rmtree(tmp, ignore_errors=True)
        return err
    # the failed writer (torch's, holding its file open from the traceback's frames) goes now,
    # or the removed files would keep their space until the error is dropped
    chained: BaseException | None = err
    seen: set[int] = set()
    while chained is not None and id(chained) not in seen:  # and the errors it was raised in
        seen.add(id(chained))
        traceback.clear_frames(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__
    gc.collect()
    shutil.rmtree(tmp, ignore_errors=True)
    free_now = _free_bytes(root)
    cause = "no space left on device" if no_space else f"{type(err).__name__}: {err}"
    last = f"`latest` still names {previous.name}" if previous else "there is no earlier checkpoint"
    error = CheckpointSaveError(
        f"checkpoint of step {step} not saved: {cause} (writing {tmp}: "
        f"{_gib(free_then)} GiB free on its disk then, {_gib(free_now)} GiB after removing the "
        f"partial folder; a checkpoint takes about {needed / GIB:.2f} GiB); the partial folder "
        f"was removed and {last}: free disk space (or lower keep_checkpoints) and start the run "
        "again to resume"
    )
    error.errno = errno.ENOSPC if no_space else code
    return error


def checkpoint_bytes(engine: TrainEngine) -> int:
    """An estimate of one checkpoint's size on disk, from the parameters (counted whole under
    ZeRO-3) and their dtypes:

        weights   every parameter in its dtype (a full model, or ARCO's merged model with its
                  adapters and head), or only the LoRA weights of a plain LoRA model
        state     per trained parameter: itself in its dtype, AdamW's two fp32 moments (8
                  bytes) and, for a parameter under 4 bytes (bf16), its fp32 master (4 bytes)

    Tokenizer files, the RNG states and JSON are left out (megabytes)."""
    model = engine.model
    params = list(model.named_parameters())
    lora_only = is_lora_model(model) and not hasattr(model, "write_checkpoint_files")
    weights = sum(_nbytes(p) for n, p in params if not lora_only or "lora_" in n)
    state = 0
    for _, p in params:
        if p.requires_grad:
            size = p.dtype.itemsize
            state += _numel(p) * (size + 8 + (4 if size < 4 else 0))
    return weights + state


def planned_saves(steps: int, save_every: int, start: int = 1) -> int:
    """The checkpoints a run saves from step ``start`` to ``steps``: every ``save_every`` steps
    (0: none) and at the last step (``common.run.schedule``)."""
    if start > steps:
        return 0
    every = steps // save_every - (start - 1) // save_every if save_every else 0
    return every + (0 if save_every and steps % save_every == 0 else 1)


def check_checkpoint_space(
    run_dir: str | Path, bytes_per_checkpoint: int, keep: int | None, saves: int | None = None
) -> float:
    """Before training: will the checkpoints fit? Raises ``CheckpointSpaceError`` when the free
    space on ``run_dir/checkpoints``'s disk is less than they need, warns (printed) when it is
    under ``SPACE_MARGIN`` times that; returns free / needed (inf: nothing to save).

    keep: the checkpoints kept (``keep_checkpoints``; None: every save is kept). saves: the
    checkpoints this start still writes (``planned_saves``; None: unbounded). At most
    ``keep + 1`` are on disk at once (a new one is written before the oldest is removed), and
    no more than those already there plus ``saves``; those already there take no new space,
    but every save needs room for one more."""
    root = Path(run_dir) / "checkpoints"
    if saves is not None and saves <= 0:
        return math.inf
    if keep is None and saves is None:
        raise ValueError("check_checkpoint_space: keep=None (keep every save) needs saves")
    held = len(_complete_checkpoints(root))
    peak = min(
        keep + 1 if keep is not None else math.inf, held + saves if saves is not None else math.inf
    )
    count = max(int(peak) - held, 1)
    needed = count * bytes_per_checkpoint
    free = _free_bytes(root)
    if free is None or needed <= 0:
        return math.inf
    what = (
        f"{count} checkpoint{'s' if count > 1 else ''} of about {bytes_per_checkpoint / GIB:.2f} "
        f"GiB ({needed / GIB:.2f} GiB; keep_checkpoints={keep}, {held} on disk already"
        f"{'' if saves is None else f', {saves} to save'}) under {root}, {free / GIB:.2f} GiB free"
    )
    if free < needed:
        raise CheckpointSpaceError(
            f"not enough disk space for the run's checkpoints: {what}; free space, lower "
            "keep_checkpoints or choose a run_dir on a larger disk"
        )
    if free < SPACE_MARGIN * needed:
        print(
            f"[checkpoint] warning: little disk space to spare: {what} (under "
            f"{SPACE_MARGIN}x what they need)",
            flush=True,
        )
    return free / needed


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


def check_resume_ranks(checkpoint: str | Path | None, world_size: int) -> None:
    """Before any model loads: a ``ConfigError`` when the checkpoint a start would resume from
    was written by another number of ranks (its optimizer state and RNGs are per rank), saying
    how to start instead. No checkpoint, or an unreadable state (``load_checkpoint`` says so):
    nothing to check here."""
    from common.config import ConfigError

    if checkpoint is None:
        return
    try:
        written = json.loads((Path(checkpoint) / "trainer_state.json").read_text())["world_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if written != world_size:
        raise ConfigError(
            f"{checkpoint} was written by {written} rank(s) and this start has {world_size}: "
            f"resume on {written} (GPUS={written}, or the same hostfile), or start the run "
            "again with resume=false (a checkpoint's optimizer state and RNGs are per rank)"
        )


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
    set_rng_state(_load_rng_state(path / "state", engine.rank))
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


def _remove_leftovers(root: Path) -> None:
    """Drop ``step_<N>.tmp-<pid>`` / ``.old-<pid>`` folders of crashed or failed saves."""
    for leftover in root.glob("step_*.*-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _prune(root: Path, keep_last: int | None, keep: Path) -> None:
    """Drop leftovers of crashed saves and all but the newest keep_last checkpoints."""
    _remove_leftovers(root)
    if keep_last is None:
        return
    complete = _complete_checkpoints(root)
    for old in complete[: max(len(complete) - keep_last, 0)]:
        if old != keep:
            shutil.rmtree(old)


def _numel(p: torch.Tensor) -> int:
    return int(getattr(p, "ds_numel", p.numel()))  # ZeRO-3 holds a partition; ds_numel: whole


def _nbytes(p: torch.Tensor) -> int:
    return _numel(p) * p.dtype.itemsize


def _folder_bytes(folder: Path | None) -> int:
    """The bytes of the files under ``folder`` (0: none, or unreadable)."""
    if folder is None or not folder.exists():
        return 0
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _free_bytes(path: Path) -> int | None:
    """Free bytes on the disk of ``path`` (its nearest existing parent); None when unknown."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f}"


def rng_state() -> dict[str, Any]:
    """This process's random streams (Python's, numpy's, torch's CPU and CUDA generators), as a
    checkpoint saves them (plain data: ``common.train.plain_state``)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def _load_rng_state(folder: Path, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s random streams from a checkpoint's ``state/``: ``rng_rank<r>.json``, or
    an older checkpoint's ``rng_rank<r>.pt`` read with ``weights_only=True``."""
    stem = folder / f"rng_rank{rank}"
    if exists(stem):
        return load_plain(stem)
    legacy = folder / f"rng_rank{rank}.pt"
    if legacy.is_file():
        return load_legacy_torch(legacy, "random-stream state")
    raise ValueError(f"{folder}: no random-stream state of rank {rank} ({stem.name}.json)")


def set_rng_state(state: dict[str, Any]) -> None:
    """The random streams ``rng_state`` returned, restored."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
