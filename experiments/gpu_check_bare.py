"""``make gpu-check-bare``: what one GPU proves on a bare node, with the node's own torch.

For a cluster node or container with torch (CUDA), transformers and peft, no vLLM, no network:
it runs with the node's ``python3`` from the project tree, plus DeepSpeed and what it imports from
the wheelhouse (``scripts/wheelhouse.py``). Models are the paper architectures' configs with
random weights; nothing comes from a hub. Stages (each one PASS/FAIL line):

- ``nccl``: one NCCL rank: ``collective_device()`` is the GPU, a CPU tensor in an NCCL
  all-reduce raises (the control for the old defect), the collectives the project's reductions
  and ``any_rank`` make give the right values;
- ``deepspeed``: per ZeRO stage the paper configs use, bf16, the project's DeepSpeed backend on
  one rank: the optimizer class, and a non-finite loss that leaves the weights, the optimizer
  state and the learning rate bit-identical;
- ``width``: a Qwen3-1.7B-shaped model (random bf16 weights saved and read back by the project's
  loader) in ``TrainEngine`` (bf16, gradient checkpointing), two updates of ``policy_update`` at
  EviBack's paper length with a padded row: training mode on, rotary buffers fp32, memory after
  load, after the first update and in each micro-batch against the memory plan's numbers for
  that shape, and the update's throughput (tokens/s, MFU);
- ``zero2``: ZeRO-2 on one rank at that shape: memory against the plan's optimizer and gradient
  terms;
- ``logprob_gap``: the HF engine's sampling log-probs against the trainer's; a control, the
  trainer's copy with bf16 rotary buffers, must exceed the run's gap limit;
- ``arco_mu``: ARCO's μ update (``rubric_update``) at Qwen3-4B width (a few layers): the bytes
  it saves for the backward are the checkpointed amount, not every layer's.

``--allow-cpu`` runs the same stages at tiny widths on a CPU (gloo, counted bytes instead of the
CUDA allocator's); the test suite does, so the script cannot rot. Exit status 0 when all pass, 1
when one fails, 2 when it cannot run. ``--out``: ``gpu_check_bare.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a node's JAX would take 75% of the GPU
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from common.train.memory_plan import PAPER_MODELS, ModelArch  # noqa: E402

GiB = 2**30
MiB = 2**20
# the run's gap limit (experiments.gpu_check, the guards): a bf16 gap is a few hundredths
GAP_LIMIT = 0.1
# measured memory may exceed the plan by this share before the stage fails (allocator rounding,
# cuBLAS workspaces); the plan is a floor with named assumptions
PLAN_SLACK = 0.15
PLAN_FLOOR = 256 * MiB
# bf16 dense peak of a GPU, for MFU (vendor data sheets, SXM parts)
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}


@dataclass(frozen=True)
class Widths:
    """The shapes the stages run at."""

    name: str
    policy: ModelArch  # the width and ZeRO-2 stages' model (EviBack's Qwen3-1.7B)
    lengths: tuple[tuple[int, ...], ...]  # each micro-batch's row lengths (tokens)
    response: int  # each row's sampled tail (loss positions)
    logprob_chunk: int
    probe_layers: int  # the DeepSpeed stage's model: the policy's width, this many layers
    probe_vocab: int
    gap_arch: ModelArch  # the log-prob gap stage's model
    gap_layers: int
    gap_prompt: int  # positions the rotary fault needs to show
    gap_new: int
    mu: ModelArch  # ARCO's μ (Qwen3-4B), a few layers
    mu_tokens: int
    configs: tuple[str, ...] = ()  # where the shapes come from


def _tiny(name: str, hidden: int, layers: int, vocab: int) -> ModelArch:
    return ModelArch(
        name,
        "qwen3",
        hidden,
        layers,
        4,
        2,
        hidden // 4,
        2 * hidden,
        vocab,
        True,
        qk_norm=True,
        source="gpu_check_bare's tiny width",
    )


def paper_widths() -> Widths:
    """The GPU's shapes, from the paper configs: EviBack 1.7B's context and micro-batch, ARCO's
    Qwen3-4B."""
    import yaml

    config = "eviback/configs/qwen3_1.7b.yaml"
    data = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))
    context, rows = int(data["agent"]["max_context"]), int(data["loss"]["micro_batch_size"])
    response = int(data["agent"]["max_response_tokens"])
    padded = tuple([context] * (rows - 1) + [context * 3 // 4])  # the last row padded
    return Widths(
        name="paper",
        policy=PAPER_MODELS["Qwen/Qwen3-1.7B"],
        lengths=(padded, tuple([context] * rows)),
        response=response,
        logprob_chunk=int(data["loss"].get("logprob_chunk", 1024)),
        probe_layers=2,
        probe_vocab=4096,
        gap_arch=PAPER_MODELS["Qwen/Qwen3-1.7B"],
        gap_layers=4,
        gap_prompt=4096,
        gap_new=32,
        mu=dataclasses.replace(PAPER_MODELS["Qwen/Qwen3-4B"], num_layers=4),
        mu_tokens=2048,
        configs=(config, "arco/configs/qwen3_4b_hotpotqa.yaml"),
    )


def tiny_widths() -> Widths:
    """The CPU's shapes (``--allow-cpu``): the same stages in seconds."""
    return Widths(
        name="tiny",
        policy=_tiny("tiny-qwen3", 64, 2, 512),
        lengths=((256, 180), (256, 256)),
        response=64,
        logprob_chunk=64,
        probe_layers=2,
        probe_vocab=512,
        gap_arch=_tiny("tiny-qwen3-gap", 128, 2, 512),
        gap_layers=2,
        gap_prompt=2048,
        gap_new=8,
        mu=_tiny("tiny-qwen3-mu", 64, 4, 512),
        mu_tokens=256,
    )


# --------------------------------------------------------------------------- results


@dataclass
class Stage:
    """One stage's verdict: its checks (name -> passed, detail) and measured numbers."""

    name: str
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and bool(self.checks) and all(ok for ok, _ in self.checks.values())

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks[name] = (bool(ok), detail)

    def line(self) -> str:
        if self.error:
            return f"[gpu-check-bare] FAIL {self.name}: {self.error}"
        failed = [f"{k}: {d}" for k, (ok, d) in self.checks.items() if not ok]
        shown = failed or [f"{k}: {d}" for k, (_, d) in self.checks.items()]
        verdict = "PASS" if self.ok else "FAIL"
        return f"[gpu-check-bare] {verdict} {self.name} ({self.seconds:.0f} s): " + "; ".join(shown)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "checks": {k: {"ok": ok, "detail": d} for k, (ok, d) in self.checks.items()},
            "data": self.data,
        }


def within_plan(measured: float, planned: float) -> bool:
    """Whether a measured amount fits the plan's (``PLAN_SLACK`` of it, at least ``PLAN_FLOOR``)."""
    return measured <= planned + max(PLAN_SLACK * planned, PLAN_FLOOR)


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.2f} GiB" if nbytes >= 0.1 * GiB else f"{nbytes / MiB:.1f} MiB"


def mfu(tokens_per_s: float, arch: ModelArch, tokens: int, device_name: str) -> float | None:
    """Model FLOPs utilisation of an update: 6 N + 6 L H T FLOPs a token (the weights' forward
    and backward, causal attention at mean length T; the recomputation of checkpointing not
    counted, as usual), against the GPU's bf16 dense peak; None for an unknown GPU."""
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in device_name), None)
    if peak is None:
        return None
    n = arch.params() - arch.vocab_size * arch.hidden_size * (1 if arch.tied_embeddings else 2)
    per_token = 6 * n + 6 * arch.num_layers * arch.num_heads * arch.head_dim * tokens
    return tokens_per_s * per_token / peak


# --------------------------------------------------------------------------- memory readings


def storages_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """The bytes of the distinct storages behind ``tensors`` (a view counts with its base)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _state_tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _state_tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _state_tensors(v)


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """What training holds between updates, counted: weights, gradients, the optimizer's
    parameters (fp32 masters) and state. The CPU's reading; a GPU reads its allocator too."""

    def tensors() -> Iterator[torch.Tensor]:
        for p in model.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        for group in optimizer.param_groups:
            for p in group["params"]:
                yield p
                if p.grad is not None:
                    yield p.grad
        yield from _state_tensors(list(optimizer.state.values()))

    return storages_bytes(tensors())


def allocated() -> int | None:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else None


@contextmanager
def saved_bytes(model: torch.nn.Module) -> Iterator[list[int]]:
    """Inside the block, ``counter[0]``: the bytes autograd saves for the backward, each storage
    once, the model's parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    counter = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            counter[0] += s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter


# --------------------------------------------------------------------------- models


def hf_config(arch: ModelArch, layers: int | None = None, vocab: int | None = None):
    """A transformers config of ``arch`` (``layers``, ``vocab``: fewer, for a smaller copy),
    as the memory plan builds the layers it measures."""
    from common.train.memory_plan import torch_config

    return torch_config(arch, layers or arch.num_layers, vocab or arch.vocab_size)


def random_model(config: Any, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def train_config(**kw: Any):
    from common.train.config import TrainConfig

    return TrainConfig(**{"lr": 1e-6, "bf16": True, "max_grad_norm": 1.0, **kw})


def device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else (torch.device("cpu"))
    )


def free_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- stages


def stage_nccl(stage: Stage, widths: Widths, out: Path) -> None:
    """The process group (NCCL on a GPU, gloo on a CPU) and the project's collectives in it."""
    import torch.distributed as dist

    from common.guards import any_rank
    from common.train.distributed import (
        all_reduce_values,
        collective_device,
        init_distributed,
        reduce_in_group,
    )

    rank, world, _ = init_distributed()
    backend = str(dist.get_backend())
    stage.data |= {"backend": backend, "rank": rank, "world": world}
    where = collective_device()
    want = "cuda" if torch.cuda.is_available() else "cpu"
    stage.check("collective_device", where.type == want, f"{where} under {backend}")
    if "nccl" in backend:  # the control: NCCL refuses a CPU tensor, gloo would not
        try:
            dist.all_reduce(torch.ones(1))  # the one collective outside the helper, on purpose
            stage.check("CPU tensor refused", False, "an NCCL all-reduce took a CPU tensor")
        except (RuntimeError, ValueError) as err:
            stage.check("CPU tensor refused", True, f"{type(err).__name__}: {str(err)[:60]}")
    else:
        stage.data["control"] = f"not applicable under {backend} (it takes CPU tensors)"
    # world 1: the project's functions take their one-process path; the collective they make at
    # world > 1 (reduce_in_group: a float64 tensor on collective_device) runs here directly
    values = [1.5, -2.0, 3.0]
    ok = all_reduce_values(values, "max") == values and any_rank([False, True]) == [False, True]
    ok = ok and all(reduce_in_group(values, op) == values for op in ("sum", "max", "min"))
    ok = ok and reduce_in_group([0.0, 1.0], "max") == [0.0, 1.0]
    stage.check("reductions", ok, f"sum/max/min and any_rank's max on {where}")


def config_stages() -> dict[int, list[str]]:
    """The ZeRO stages the paper configs train with, each with its configs."""
    import yaml

    stages: dict[int, list[str]] = {}
    for pattern in (
        "eviback/configs/qwen3_*.yaml",
        "cer/configs/qwen3_*.yaml",
        "arco/configs/*_*.yaml",
    ):
        for path in sorted(ROOT.glob(pattern)):
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            stage = (data.get("train") or {}).get("zero_stage")
            if stage is not None:
                stages.setdefault(int(stage), []).append(str(path.relative_to(ROOT)))
    return stages


# what each stage must build with bf16 (DeepSpeed 0.19.8): ZeRO's optimizers, not BF16_Optimizer;
# stages 0 and 1 with bf16 weights are refused (deepspeed_config), they sum gradients in bf16
EXPECTED_OPTIMIZER = {
    2: "DeepSpeedZeroOptimizer",
    3: "DeepSpeedZeroOptimizer_Stage3",
}


def _snapshot(backend: Any) -> list[torch.Tensor]:
    """Every tensor of the weights and the optimizer state, and the learning rates, cloned."""
    engine = backend.engine
    held = [getattr(p, "ds_tensor", p).detach().clone() for p in engine.module.parameters()]
    state = engine.optimizer.state_dict()
    held += [t.detach().clone() for t in _state_tensors(state)]
    lrs = [g["lr"] for g in engine.optimizer.param_groups] + list(backend.scheduler.get_last_lr())
    return held + [torch.tensor(lrs, dtype=torch.float64)]


def _identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())
        for x, y in zip(a, b, strict=True)
    )


def _lm_loss(backend: Any, ids: torch.Tensor) -> torch.Tensor:
    return backend.forward(input_ids=ids, labels=ids, use_cache=False).loss


def stage_deepspeed(stage: Stage, widths: Widths, out: Path) -> None:
    """Each configured ZeRO stage, bf16, on one rank: its optimizer class, and a NaN loss that
    changes nothing."""
    from common.train.engine import _DeepSpeedBackend, cast_parameters, deepspeed_config

    stages = config_stages()
    stage.data["stages"] = {str(k): v for k, v in stages.items()}
    refused = []
    for zero in (0, 1):
        try:
            deepspeed_config(train_config(zero_stage=zero), True)
        except ValueError:
            refused.append(zero)
    stage.check("ZeRO-0/1 with bf16 refused", refused == [0, 1], f"refused {refused}")
    config = hf_config(widths.policy, widths.probe_layers, widths.probe_vocab)
    for zero in sorted(stages):
        model = random_model(config, torch.float32, seed=zero)
        model.train()
        model.to(device())
        cast_parameters(model, torch.bfloat16)
        cfg = train_config(zero_stage=zero, lr=1e-3)
        backend = _DeepSpeedBackend(
            model, [{"name": "all", "params": list(model.parameters())}], cfg, True
        )
        name = type(backend.engine.optimizer).__name__
        want = EXPECTED_OPTIMIZER.get(zero)
        stage.check(
            f"ZeRO-{zero} optimizer",
            want is None or name == want,
            f"{name}" + (f" (expected {want})" if want and name != want else ""),
        )
        ids = torch.randint(0, widths.probe_vocab, (2, 64), device=device())

        backend.backward(_lm_loss(backend, ids))
        norm, skipped = backend.step(True)
        before = _snapshot(backend)
        backend.backward(_lm_loss(backend, ids) * math.nan)
        norm_nan, skipped_nan = backend.step(True)
        after = _snapshot(backend)
        same = _identical(before, after)
        stage.check(
            f"ZeRO-{zero} NaN loss",
            (not skipped) and skipped_nan and same,
            f"finite step applied (norm {norm:.3g}), NaN step "
            f"{'skipped' if skipped_nan else 'APPLIED'} (norm {norm_nan}), weights, optimizer "
            f"state and lr {'bit-identical' if same else 'CHANGED'}",
        )
        stage.data[f"zero{zero}"] = {"optimizer": name, "nan_skipped": skipped_nan, "same": same}
        del backend, model
        free_memory()


def _trajectories(lengths: tuple[int, ...], response: int, vocab: int, group: int, seed: int):
    """Rows of the given lengths, random ids, the last ``response`` tokens sampled."""
    from common.rollout.trajectory import Trajectory

    g = torch.Generator().manual_seed(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        t = Trajectory(f"g{group}", i, f"q{group}", "q", ["a"], ids[: n - response])
        t.append(ids[n - response :], True, [0.0] * response)
        rows.append(t)
    return rows


def _plan_terms(arch: ModelArch, widths: Widths, zero_stage: int, ranks: int) -> dict[str, float]:
    from common.train.memory_plan import update_terms

    rows = max(len(b) for b in widths.lengths)
    tokens = max(max(b) for b in widths.lengths)
    return update_terms(
        arch,
        rows=rows,
        tokens=tokens,
        zero_stage=zero_stage,
        ranks=ranks,
        gradient_checkpointing=True,
        bf16=True,
        padded=True,
        logprob_chunk=widths.logprob_chunk,
    )


def stage_width(stage: Stage, widths: Widths, out: Path) -> None:
    """The paper-width model through ``TrainEngine`` and ``policy_update``, memory against the plan."""
    from common.rl_loop import policy_update
    from common.run_config import LossConfig
    from common.train.engine import TrainEngine, load_for_training

    arch = widths.policy
    folder = out / "width_model"
    random_model(hf_config(arch), torch.bfloat16).save_pretrained(folder)
    free_memory()
    cfg = train_config(gradient_checkpointing=True, grad_accum=len(widths.lengths))
    base = allocated()
    train = TrainEngine(load_for_training(folder, cfg), cfg)
    model = train.model
    inv = [b for n, b in model.named_buffers() if n.endswith("inv_freq")]
    stage.check(
        "train mode",
        model.training and model.is_gradient_checkpointing,
        f"training {model.training}, checkpointing {model.is_gradient_checkpointing}",
    )
    stage.check(
        "rotary fp32",
        bool(inv) and all(b.dtype == torch.float32 for b in inv),
        f"inv_freq {sorted({str(b.dtype) for b in inv})}",
    )
    plan = _plan_terms(arch, widths, 0, 1)
    stage.data["plan"] = {k: round(v / GiB, 3) for k, v in plan.items()}
    masters = sum(p.numel() for p in model.parameters() if p.requires_grad) * 4
    read = _reader(base, model, train.optimizer)
    after_load = read()
    planned_load = plan["weights"] + masters
    stage.check(
        "memory after load",
        within_plan(after_load, planned_load),
        f"{gib(after_load)} (plan {gib(planned_load)}: bf16 weights + fp32 masters)",
    )
    loss_cfg = LossConfig(
        micro_batch_size=max(len(b) for b in widths.lengths),
        logprob_chunk=widths.logprob_chunk,
        aggregation="token_mean",
    )
    trajs = [
        t
        for i, b in enumerate(widths.lengths)
        for t in _trajectories(b, widths.response, arch.vocab_size, i, i)
    ]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(len(trajs))])
    timings = []
    with micro_batch_peaks(model, train.optimizer, base) as peaks:
        t0 = _sync_time()
        stats = policy_update(train, trajs, advantages, loss_cfg, pad_id=0)
        timings.append(_sync_time() - t0)
    after_first = read()
    t0 = _sync_time()  # the second update: Adam's state exists, the throughput's
    stats = policy_update(train, trajs, advantages, loss_cfg, pad_id=0)
    timings.append(_sync_time() - t0)
    planned_held = plan["weights"] + plan["optimizer"]
    stage.check(
        "memory after the first update",
        within_plan(after_first, planned_held),
        f"{gib(after_first)} (plan {gib(planned_held)}: weights + masters + Adam m, v)",
    )
    planned_peak = plan["peak"]
    worst = max(peaks) if peaks else math.nan
    stage.check(
        "memory per micro-batch",
        bool(peaks) and within_plan(worst, planned_peak),
        f"peaks {', '.join(gib(p) for p in peaks)} (plan {gib(planned_peak)})",
    )
    tokens = sum(sum(b) for b in widths.lengths)
    rate = tokens / timings[1]
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    util = mfu(rate, arch, tokens // len(trajs), name)
    stage.check(
        "update",
        math.isfinite(stats["grad_norm"]) and stats["train_mode"] == 1.0,
        f"{rate:,.0f} tokens/s, MFU {'n/a' if util is None else f'{util:.1%}'}, "
        f"grad norm {stats['grad_norm']:.3g}",
    )
    stage.data |= {
        "after_load_gib": after_load / GiB,
        "after_first_update_gib": after_first / GiB,
        "micro_batch_peaks_gib": [p / GiB for p in peaks],
        "tokens_per_s": rate,
        "mfu": util,
        "update_seconds": timings,
        "lengths": widths.lengths,
        "reading": "torch.cuda.memory_allocated" if torch.cuda.is_available() else "counted",
    }
    del train, model
    free_memory()


def _reader(base: int | None, model: torch.nn.Module, optimizer: Any) -> Callable[[], float]:
    """What training holds now: the CUDA allocator's bytes since ``base``, or on a CPU the
    counted tensors (``held_bytes``)."""
    if base is not None:
        return lambda: float(allocated() - base)
    return lambda: float(held_bytes(model, optimizer))


@contextmanager
def micro_batch_peaks(
    model: torch.nn.Module, optimizer: Any, base: int | None
) -> Iterator[list[float]]:
    """Each micro-batch's peak of what training holds, from one forward of the decoder to the
    next (the last one through the optimizer step), filled in on leaving the block: on a GPU the
    allocator's peak less ``base``; on a CPU the tensors held at the forward (``held_bytes``)
    plus the bytes autograd saved in it."""
    peaks: list[float] = []
    decoder = model.get_decoder()
    if base is not None:
        started = [False]

        def mark(*_: Any) -> None:
            if started[0]:
                peaks.append(float(torch.cuda.max_memory_allocated() - base))
            torch.cuda.reset_peak_memory_stats()
            started[0] = True

        handle = decoder.register_forward_pre_hook(mark)
        try:
            yield peaks
        finally:
            handle.remove()
            peaks.append(float(torch.cuda.max_memory_allocated() - base))
        return
    marks: list[tuple[int, int]] = []  # (held, saved so far) at each forward
    with saved_bytes(model) as saved:
        handle = decoder.register_forward_pre_hook(
            lambda *_: marks.append((held_bytes(model, optimizer), saved[0]))
        )
        try:
            yield peaks
        finally:
            handle.remove()
            ends = [s for _, s in marks[1:]] + [saved[0]]
            peaks.extend(float(h + e - s) for (h, s), e in zip(marks, ends, strict=True))


def _sync_time() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def _zero_held(backend: Any) -> Iterator[torch.Tensor]:
    """What a ZeRO-1/2 engine holds between updates: the module's weights, the fp32 partitions
    and Adam's state of its basic optimizer, and any gradient partitions it keeps."""
    engine = backend.engine
    yield from engine.module.parameters()
    basic = engine.basic_optimizer
    for group in basic.param_groups:
        yield from group["params"]
    yield from _state_tensors(list(basic.state.values()))
    yield from _state_tensors(getattr(engine.optimizer, "averaged_gradients", {}))


def stage_zero2(stage: Stage, widths: Widths, out: Path) -> None:
    """ZeRO-2 on one rank at the paper width: what it holds after an update against the plan's
    weights, optimizer, gradient and ZeRO-buffer terms."""
    from common.train.engine import _DeepSpeedBackend, cast_parameters, load_for_training
    from common.train.memory_plan import (
        deepspeed_grad_bytes,
        gradient_bytes,
        optimizer_bytes,
        weight_bytes,
        zero_buffer_bytes,
    )

    arch = widths.policy
    folder = out / "width_model"
    if not (folder / "config.json").is_file():
        random_model(hf_config(arch), torch.bfloat16).save_pretrained(folder)
    cfg = train_config(zero_stage=2, gradient_checkpointing=True)
    free_memory()
    base = allocated()
    model = load_for_training(folder, cfg)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device())
    cast_parameters(model, torch.bfloat16)
    params = list(model.parameters())
    backend = _DeepSpeedBackend(model, [{"name": "all", "params": params}], cfg, True)
    n = sum(p.numel() for p in params)
    terms = {
        "weights": weight_bytes(n, 2, 1),
        "optimizer": optimizer_bytes(n, 2, 1, master=True),
        "gradients": gradient_bytes(n, 2, 1, deepspeed_grad_bytes(cfg)),
        "zero_buffers": zero_buffer_bytes(n, 2, 2),
    }
    stage.data["plan_gib"] = {k: round(v / GiB, 3) for k, v in terms.items()}
    ids = torch.randint(0, arch.vocab_size, (2, 256), device=device())
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    backend.backward(backend.forward(input_ids=ids, labels=ids, use_cache=False).loss)
    norm, skipped = backend.step(True)
    if base is not None:
        held = float(allocated() - base)
        peak = float(torch.cuda.max_memory_allocated() - base)
    else:
        held = float(storages_bytes(_zero_held(backend)))
        peak = math.nan
    planned = sum(terms.values())
    name = type(backend.engine.optimizer).__name__
    stage.check("optimizer", name == EXPECTED_OPTIMIZER[2], name)
    stage.check("step", not skipped and math.isfinite(norm), f"grad norm {norm:.3g}")
    stage.check(
        "memory after the update",
        within_plan(held, planned),
        f"{gib(held)} (plan {gib(planned)}: weights {gib(terms['weights'])}, optimizer "
        f"{gib(terms['optimizer'])}, gradients {gib(terms['gradients'])}, buffers "
        f"{gib(terms['zero_buffers'])}); peak {gib(peak) if math.isfinite(peak) else 'n/a'}",
    )
    stage.data |= {"held_gib": held / GiB, "peak_gib": peak / GiB, "optimizer": name}
    del backend, model
    free_memory()


# Random weights at their initial scale barely depend on positions (the bf16-rotary fault moves
# a 2-layer model's log-probs by 0.0003-0.0008 at 1-2k tokens, measured on CPU), so they could
# not show it; a trained model's attention is sharp. The gap stage's model is sharpened: Qwen3's
# per-head q/k norms scaled by SHARP_QK (sharper attention), the tied embeddings by SHARP_OUT
# (peakier next-token distributions). Measured on CPU (hidden 128, 2 layers, 2,048 tokens): the
# fault's gap 0.23 against the 0.1 limit.
SHARP_QK = 16.0
SHARP_OUT = 4.0


def _word_tokenizer(vocab: int):
    """A real fast tokenizer over ``vocab`` placeholder words (what the HF engine decodes with)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0")


def sharpened_model(arch: ModelArch, layers: int, seed: int = 0) -> torch.nn.Module:
    """``arch`` at ``layers`` layers, random weights with sharp attention and outputs."""
    model = random_model(hf_config(arch, layers), torch.float32, seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.mul_(SHARP_QK)
            elif "embed_tokens" in name:
                p.mul_(SHARP_OUT)
    model.generation_config.eos_token_id = None  # sample the whole budget
    return model


def stage_logprob_gap(stage: Stage, widths: Widths, out: Path) -> None:
    """The HF engine's sampling log-probs against the trainer's (``policy_update``'s gap), and
    the control: the trainer's copy with bf16 rotary buffers exceeds the limit."""
    from common.rl import forward_logprobs
    from common.rollout.batch import collate
    from common.rollout.engine import SamplingConfig
    from common.rollout.hf_engine import HFEngine
    from common.rollout.trajectory import Trajectory
    from common.train.engine import TrainEngine

    arch = widths.gap_arch
    train = TrainEngine(
        sharpened_model(arch, widths.gap_layers), train_config(gradient_checkpointing=True)
    )
    engine = HFEngine(train.model, _word_tokenizer(arch.vocab_size), batch_size=2)
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, arch.vocab_size, (widths.gap_prompt,), generator=g).tolist()
        for _ in range(2)
    ]
    params = SamplingConfig(n=1, temperature=1.0, max_tokens=widths.gap_new, seed=0)
    trajs = []
    for i, (prompt, [comp]) in enumerate(
        zip(prompts, engine.generate(prompts, params), strict=True)
    ):
        t = Trajectory("g", i, "q", "q", ["a"], prompt)
        t.append(comp.token_ids, True, comp.logprobs)
        trajs.append(t)
    batch = collate(trajs, 0).to(train.device)

    def gap(forward: Callable[..., Any], model: torch.nn.Module) -> float:
        with torch.no_grad():
            logp = forward_logprobs(
                forward, batch.input_ids, batch.attention_mask, widths.logprob_chunk, model=model
            )
        diff = (logp.float() - batch.sampling_logprobs).abs() * batch.loss_mask
        return float(diff.sum() / batch.loss_mask.sum())

    real = gap(train, train.model)
    faulty = copy.deepcopy(train.model)
    for name, buf in faulty.named_buffers():
        if name.endswith("inv_freq"):
            buf.data = buf.data.to(torch.bfloat16)
    control = gap(faulty, faulty)
    sampled = int(batch.loss_mask.sum())
    stage.check(
        "engine vs trainer",
        real <= GAP_LIMIT,
        f"gap {real:.4f} over {sampled} sampled tokens (limit {GAP_LIMIT})",
    )
    stage.check("control caught", control > GAP_LIMIT, f"bf16 rotary buffers: gap {control:.4f}")
    stage.data |= {
        "gap": real,
        "control_gap": control,
        "sampled_tokens": sampled,
        "prompt_tokens": widths.gap_prompt,
        "sharpening": [SHARP_QK, SHARP_OUT],
    }
    del train, engine, faulty
    free_memory()


ARCO_CONFIG = "arco/configs/qwen3_4b_hotpotqa.yaml"


def _mu_saved(folder: Path, widths: Widths, checkpointing: bool) -> tuple[int, dict[str, float]]:
    """The bytes autograd saves in one ``rubric_update`` over two trajectories of two steps
    (random ids, μ's prompts of ``widths.mu_tokens``), and its statistics."""
    from arco.config import ArcoConfig
    from arco.rubric_model import build_arco_model
    from arco.rubrics import RubricItem
    from arco.trainer import rubric_update
    from common.config import load_config
    from common.train.engine import TrainEngine

    on = str(checkpointing).lower()
    cfg = load_config(
        ArcoConfig,
        ROOT / ARCO_CONFIG,
        [
            f"assets.model={folder}",
            "rl.micro_batch_size=1",
            f"train.gradient_checkpointing={on}",
            "train.bf16=true",
        ],
    )
    cfg.train.grad_accum = 4  # μ's two micro-steps and π's two: no optimizer step inside μ's
    model = build_arco_model(folder, cfg.lora.as_peft(), cfg.head_k, dtype=torch.bfloat16)
    train = TrainEngine(
        model, cfg.train, param_groups=model.groups({"policy": 1e-6, "rubric": 1e-6, "head": 1e-6})
    )
    g = torch.Generator().manual_seed(2)
    vocab, n = widths.mu.vocab_size, widths.mu_tokens
    items = [
        RubricItem(
            traj,
            step,
            torch.randint(1, vocab, (n - 40,), generator=g).tolist(),
            torch.randint(1, vocab, (40,), generator=g).tolist(),
        )
        for traj in range(2)
        for step in range(2)
    ]
    with saved_bytes(train.model) as saved:
        stats = rubric_update(train, items, torch.tensor([1.0, 0.0]), cfg, 0, {})
    del train, model
    free_memory()
    return saved[0], stats


def stage_arco_mu(stage: Stage, widths: Widths, out: Path) -> None:
    """μ's update at Qwen3-4B width (a few layers), with checkpointing against without."""
    arch = widths.mu
    folder = out / "mu_model"
    random_model(hf_config(arch), torch.bfloat16).save_pretrained(folder)
    on, stats = _mu_saved(folder, widths, True)
    off, _ = _mu_saved(folder, widths, False)
    # checkpointed: each layer keeps its input (hidden x 2 bytes a token) for each of the
    # micro-batch's rows; the rest (one layer's recomputation happens in the backward)
    kept = arch.num_layers * widths.mu_tokens * arch.hidden_size * 2 * 2  # 2 rows a micro-batch
    stage.check(
        "checkpointed",
        0 < on < 0.5 * off,
        f"saved {gib(on)} with checkpointing, {gib(off)} without (layer inputs alone {gib(kept)})",
    )
    loss = stats.get("loss_mu", math.nan)
    stage.check("update", math.isfinite(loss), f"loss_mu {loss:.4g}")
    stage.data |= {
        "saved_on_bytes": on,
        "saved_off_bytes": off,
        "layer_inputs_bytes": kept,
        "layers": arch.num_layers,
        "tokens": widths.mu_tokens,
        "config": ARCO_CONFIG,
    }


# --------------------------------------------------------------------------- the command

STAGES: dict[str, Callable[[Stage, Widths, Path], None]] = {
    "nccl": stage_nccl,
    "deepspeed": stage_deepspeed,
    "width": stage_width,
    "zero2": stage_zero2,
    "logprob_gap": stage_logprob_gap,
    "arco_mu": stage_arco_mu,
}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "deepspeed"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "missing"
    out["cuda"] = str(torch.version.cuda)
    out["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_rank_group() -> None:
    """The environment of a one-rank launch, so ``init_distributed`` makes its group."""
    for key, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def run_stages(names: list[str], widths: Widths, out: Path) -> list[Stage]:
    """Each stage in order; an exception fails its stage (traceback in its data), not the rest."""
    results = []
    for name in names:
        stage = Stage(name)
        t0 = time.perf_counter()
        try:
            STAGES[name](stage, widths, out)
        except Exception as err:  # noqa: BLE001 -- a stage's failure is its result
            stage.error = f"{type(err).__name__}: {str(err)[:300]}"
            stage.data["traceback"] = traceback.format_exc()[-4000:]
        stage.seconds = time.perf_counter() - t0
        print(stage.line(), flush=True)
        results.append(stage)
        free_memory()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m experiments.gpu_check_bare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default=str(ROOT / "runs" / "gpu-check-bare"), help="report folder")
    p.add_argument("--stage", action="append", choices=sorted(STAGES), help="only these stages")
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="without CUDA: the same stages at tiny widths (gloo, counted bytes)",
    )
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print(
            "[gpu-check-bare] no CUDA device here (torch.cuda.is_available() is False); "
            "--allow-cpu runs the stages at tiny widths on the CPU",
            file=sys.stderr,
        )
        return 2
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print(
            "[gpu-check-bare] DeepSpeed is not importable: install the wheelhouse first "
            "(python3 scripts/wheelhouse.py install; docs/gpu.md)",
            file=sys.stderr,
        )
        return 2
    widths = paper_widths() if cuda else tiny_widths()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    one_rank_group()
    t0 = time.perf_counter()
    names = [n for n in STAGES if not args.stage or n in args.stage]
    with tempfile.TemporaryDirectory(dir=out) as work:
        stages = run_stages(names, widths, Path(work))
    failed = sum(not s.ok for s in stages)
    seconds = time.perf_counter() - t0
    summary = (
        f"[gpu-check-bare] {len(stages) - failed} passed, {failed} failed in {seconds:.0f} s "
        f"({widths.name} widths)"
    )
    print(summary, flush=True)
    report = {
        "versions": versions(),
        "widths": widths.name,
        "seconds": round(seconds, 1),
        "passed": len(stages) - failed,
        "failed": failed,
        "stages": [s.to_json() for s in stages],
    }
    (out / "gpu_check_bare.json").write_text(
        json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8"
    )
    (out / "gpu_check_bare.txt").write_text(
        "\n".join([*(s.line() for s in stages), summary]) + "\n", encoding="utf-8"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    from common.train.distributed import exit_process

    exit_process(main())
