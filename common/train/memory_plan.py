"""A run's GPU memory per rank, planned from its config before anything loads.

    python -m common.train.memory_plan --config cer/configs/qwen3_8b_base_math.yaml [--ranks 8]

For each GPU size (an 80 GB and a 141 GB GPU unless told) the plan lists, per rank: the weights,
the optimizer states and the gradients by ZeRO stage and rank count, ZeRO's own buffers, the
activations of one micro-batch with and without gradient checkpointing (for ARCO π's rows and
μ's rubric rows), the logits that exist at once, vLLM's share and the KV cache it leaves for
the rollouts; then whether the two phases of a step (rollout: vLLM awake; update: vLLM asleep
when ``engine.sleep_during_update``) fit. ``update_terms``: the update's terms of one
full-parameter model at a given shape (for a check on a bare GPU node).

What is counted, and how:

- Architecture: the model's ``config.json`` (a local folder, or the Hugging Face cache; never
  the network), else ``PAPER_MODELS``, the paper models' published ``config.json`` numbers.
  The parameter count is computed from it (Qwen3-0.6B: 596,049,920, as published).
- Training precision (``common.train.engine``): bf16 weights, fp32 master copies and fp32 Adam
  m, v (12 bytes a parameter); gradients in DeepSpeed's ``grad_accum_dtype`` (read from the
  engine's own ``deepspeed_config``; bf16 unless it says fp32), fp32 on one rank (the plain
  backend sums them into the fp32 masters). LoRA (ARCO): frozen bf16 base, fp32 adapters
  (two trained, two frozen reference copies) and μ's fp32 scoring head, no master copies.
- ZeRO (the standard partitioning): stage 1 shards the optimizer states over the ranks, stage 2
  also the gradients, stage 3 also the weights. DeepSpeed's defaults hold (the engine sets
  none): a reduce bucket of 5e8 elements at stages 2 and 3, and at stage 3 up to 1e9 gathered
  parameters live at once (``stage3_max_live_parameters``).
- Activations: *measured*, not guessed (``measure_activation_cost``): one forward of a 2-layer
  model at the real width (real hidden, FFN, heads; tiny vocabulary) on CPU in bf16, with the
  bytes of every tensor autograd saves for the backward counted by
  ``torch.autograd.graph.saved_tensors_hooks`` (parameters excluded, each storage once), per
  decoder layer and outside the layers, at three sequence lengths, fitted as c0 + a·T + b·T²
  per row (unpadded, b is 0: SDPA's flash and memory-efficient kernels save no T × T weights;
  the fit would show it if a kernel did). Scaled to the micro-batch and the layers; with
  checkpointing a layer keeps only its input (hidden × 2 bytes a token) and one layer's
  activations exist again during its recomputation. Under LoRA the first layer saves less
  than the others (its input needs no gradient); the others' count is used for every layer.
- Padded rows (an update's micro-batch of more than one row is taken as padded, as at its
  longest lengths it is): measured on a row with a padding mask. HF then repeats K and V to
  the query heads' count before SDPA (``repeat_kv``: HF's SDPA path takes GQA only without a
  mask), so they are saved at that count, and SDPA saves its own bf16 copy of the boolean mask
  ([rows, 1, T, T]) in every layer (b = 2); with checkpointing HF's boolean mask (1 byte an
  entry) is held for the recomputation. ARCO's shared-prefix trunks pass one additive 4D
  mask, saved once, outside the layers (measured as such). An unpadded row has no mask.
- ARCO's μ rows (``rl.mu_single_forward``: μ's update forward and backward end before π's, so
  the update's activation peak is the larger of the two; ``false``: π's and μ's forwards live
  together until their joint backward). A micro-batch of ``rl.micro_batch_size`` trajectories
  of ``env.max_searches + 1`` steps; a rubric row at most ``agent.max_context`` tokens of
  trajectory plus μ's templates (``RUBRIC_CHARS_PER_TOKEN``, ``RUBRIC_LABEL_TOKENS``) and
  ``rubric.max_new_tokens`` of criteria; ``rubric.shared_prefix``: a trajectory's rows packed
  as its longest row and each other row's tail (its action, the request, its criteria), else
  one padded row a step. μ's logits at its criteria positions (the KL, ``rl.mu_kl_coef`` > 0).
- Logits: the policy loss projects ``loss.logprob_chunk`` positions at a time
  (``common.rl.logprobs_from_hidden``), so [chunk, vocab], not [tokens, vocab];
  ``LOGIT_ENTRY_BYTES`` an entry at the backward's peak. ARCO projects its loss positions only.
- vLLM: ``gpu_memory_utilization`` × the GPU is its share; inside it its bf16 weights (and LoRA
  slots), the activations of its profiling forward (``max_num_batched_tokens`` tokens and
  ``max_num_seqs`` rows of sampler logits: the config's ``engine.max_num_batched_tokens`` and
  ``engine.max_num_seqs`` where set, else vLLM 0.32's defaults on an H100/H200 for the ``LLM``
  class) and its CUDA graphs; the rest is KV cache, 2 × layers × KV heads × head_dim × 2 bytes a
  token. vLLM refuses to start when it holds less than one ``max_model_len`` sequence.
- Sleep: with ``engine.sleep_during_update`` vLLM releases its weights and KV cache during the
  update; ``VLLM_ASLEEP_BYTES`` (its CUDA graphs and buffers the sleep allocator does not
  manage) is assumed to stay. Without it vLLM's whole share stays during the update.

Not counted: CER's no-grad prefix-scorer forward (its own batch, in the reward phase); ARCO's
no-grad scoring forward (``arco.rubrics.score_items``: with ``rl.mu_single_forward: false``,
frozen μ and the PRM baseline, after vLLM sleeps; it keeps the full [rows, T, vocab] logits
and every layer's hidden states of ``rl.score_batch_size`` rows); the no-grad reference
forwards' transient layer (π_ref, μ_ref); and memory fragmentation beyond
``CUDA_RESERVED_BYTES``. Estimates are marked as such in the table; the plan is a floor with
named assumptions, not a measurement on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GiB = 2**30
MiB = 2**20
# nvidia-smi's total memory of an H100 80GB HBM3 and of an H200 (what a process can address)
GPUS: dict[str, int] = {"80 GB": 81559 * MiB, "141 GB": 143771 * MiB}
DEFAULT_RANKS = 8  # one node of 8 GPUs: the configs give global batch sizes, not a GPU count

# DeepSpeed 0.19's ZeRO defaults (runtime/zero/config.py): the engine sets no bucket or live size
REDUCE_BUCKET_ELEMENTS = 500_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
# vLLM 0.32's defaults for the LLM class on a GPU of >= 70 GiB that is not an A100
# (engine/arg_utils.py, get_batch_defaults); the project's VLLMEngine sets neither
VLLM_MAX_NUM_BATCHED_TOKENS = 16384
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_LORAS = 2  # the ARCO trainer's (policy, rubric)
# Assumptions, not measurements (stated in the plan's notes):
VLLM_CUDA_GRAPH_BYTES = 1 * GiB  # vLLM's captured CUDA graphs, inside its share
VLLM_ASLEEP_BYTES = 1 * GiB  # what a sleeping engine keeps (graphs, buffers outside its pool)
CUDA_RESERVED_BYTES = 2 * GiB  # CUDA context, NCCL buffers, allocator slack, per process
# One [chunk, vocab] logit entry at the backward's peak (common.rl._chunked recomputes a chunk):
# torch.profiler's op-level running total over logprobs_from_hidden's forward and backward
# (bf16, 1,024 x 32,000, CPU) peaks at 7.5 bytes an entry (fp32 logits kept for logsumexp, then
# their fp32 gradient); 12 leaves room for the temporaries inside an op (logsumexp's backward).
LOGIT_ENTRY_BYTES = 12
MASK_ENTRY_BYTES = 2  # an additive mask in bf16
BOOL_MASK_ENTRY_BYTES = 1  # HF's boolean padding mask
MASKS = ("none", "padding", "additive")  # how a measured batch is masked (``_saved_bytes``)
LOGPROB_CHUNK = 1024  # ``loss.logprob_chunk``'s default (common.run_config.LossConfig)
# μ's rubric prompt around the trajectory (assumed): its templates' characters at 3 a token
# (English text runs about 4 in Qwen's and Llama's tokenizers: an overcount), and the chat
# template's and the prompt's labels (Question, Trajectory so far, Searches remaining, Action).
RUBRIC_CHARS_PER_TOKEN = 3
RUBRIC_LABEL_TOKENS = 48
ADAM_STATE_BYTES = 8  # fp32 m and v
MASTER_BYTES = 4  # fp32 master copy of a bf16 weight


class MemoryPlanError(ValueError):
    """A config or model the plan cannot be made for; the message names the file or key."""


# --------------------------------------------------------------------------- the architecture


@dataclass(frozen=True)
class ModelArch:
    """The numbers of a decoder-only transformer that memory depends on."""

    name: str
    model_type: str  # transformers' model_type: qwen3, llama, ...
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    qk_norm: bool = False  # Qwen3's per-head RMSNorm on q and k
    attention_bias: bool = False
    source: str = ""

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear module of a decoder layer, by its HF name."""
        h, q, kv, i = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
            self.intermediate_size,
        )
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """Parameters of one decoder layer: projections, biases, norms."""
        linear = sum(a * b for a, b in self.linear_shapes().values())
        bias = (
            (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        )
        norms = 2 * self.hidden_size + (2 * self.head_dim if self.qk_norm else 0)
        return linear + bias + norms

    def params(self) -> int:
        """All parameters: embeddings, layers, the final norm, an untied output head."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tied_embeddings else embed
        return embed + self.num_layers * self.layer_params() + self.hidden_size + head

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache a token takes: K and V of every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _qwen3(name: str, hidden: int, layers: int, heads: int, inter: int, tied: bool) -> ModelArch:
    return ModelArch(
        name,
        "qwen3",
        hidden,
        layers,
        heads,
        8,
        128,
        inter,
        151936,
        tied,
        qk_norm=True,
        source=f"built-in table: https://huggingface.co/{name}/blob/main/config.json",
    )


# The paper models, from their published config.json files (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
# tie_word_embeddings). The Base and Instruct-2507 variants share their size's architecture.
PAPER_MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in (
        _qwen3("Qwen/Qwen3-0.6B", 1024, 28, 16, 3072, True),
        _qwen3("Qwen/Qwen3-1.7B", 2048, 28, 16, 6144, True),
        _qwen3("Qwen/Qwen3-4B", 2560, 36, 32, 9728, True),
        _qwen3("Qwen/Qwen3-4B-Base", 2560, 36, 32, 9728, True),
        _qwen3("Qwen/Qwen3-4B-Instruct-2507", 2560, 36, 32, 9728, True),
        _qwen3("Qwen/Qwen3-8B", 4096, 36, 32, 12288, False),
        _qwen3("Qwen/Qwen3-8B-Base", 4096, 36, 32, 12288, False),
        ModelArch(
            "meta-llama/Llama-3.2-3B-Instruct",
            "llama",
            3072,
            28,
            24,
            8,
            128,
            8192,
            128256,
            True,
            source="built-in table: "
            "https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json",
        ),
    )
}


def arch_from_config_json(data: Mapping[str, Any], name: str, source: str) -> ModelArch:
    """A ``ModelArch`` from the fields of an HF ``config.json`` (``source``: the file, for errors)."""
    try:
        hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
        return ModelArch(
            name=name,
            model_type=str(data.get("model_type", "")),
            hidden_size=hidden,
            num_layers=int(data["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            intermediate_size=int(data["intermediate_size"]),
            vocab_size=int(data["vocab_size"]),
            tied_embeddings=bool(data.get("tie_word_embeddings", False)),
            qk_norm=data.get("model_type") == "qwen3",
            attention_bias=bool(data.get("attention_bias", data.get("model_type") == "qwen2")),
            source=source,
        )
    except KeyError as e:
        raise MemoryPlanError(f"{source}: no {e.args[0]!r} key (not a decoder-only LM?)") from None


def model_arch(model: str, key: str = "assets.model") -> ModelArch:
    """The architecture of ``model``: its config.json in a local folder or in the Hugging Face
    cache, else the built-in ``PAPER_MODELS`` table. Never touches the network."""
    from common.model_id import hub_cache_dir

    path = Path(model).expanduser()
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise MemoryPlanError(f"{key}: {model!r} is a folder without config.json")
        return arch_from_config_json(json.loads(file.read_text()), model, str(file))
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json", cache_dir=str(hub_cache_dir()))
    except Exception:  # noqa: BLE001 - not a hub id: the table decides
        cached = None
    if isinstance(cached, str):
        return arch_from_config_json(json.loads(Path(cached).read_text()), model, cached)
    if model in PAPER_MODELS:
        return PAPER_MODELS[model]
    raise MemoryPlanError(
        f"{key}: {model!r} has no config.json in a local folder or the Hugging Face cache, and "
        f"is not among the built-in paper models ({', '.join(PAPER_MODELS)})"
    )


# --------------------------------------------------------------------------- training formulas


@dataclass(frozen=True)
class LoraShape:
    """LoRA adapters over a frozen base: ``trained`` adapters learn, ``frozen`` are reference
    copies; ``extra_trained`` counts other trained fp32 weights (ARCO's scoring head)."""

    r: int
    targets: tuple[str, ...]
    dropout: float = 0.0
    trained: int = 1
    frozen: int = 0
    extra_trained: int = 0

    def adapter_params(self, arch: ModelArch) -> int:
        """Parameters of one adapter: r × (in + out) for each target module of each layer."""
        shapes = arch.linear_shapes()
        unknown = sorted(set(self.targets) - set(shapes))
        if unknown:
            raise MemoryPlanError(
                f"lora.target_modules: {unknown} are not linear modules of a {arch.model_type} "
                f"layer ({', '.join(shapes)})"
            )
        return arch.num_layers * sum(self.r * sum(shapes[t]) for t in self.targets)

    def trained_params(self, arch: ModelArch) -> int:
        return self.trained * self.adapter_params(arch) + self.extra_trained


def shard(nbytes: float, ranks: int, sharded: bool) -> float:
    """``nbytes`` on one rank: split over ``ranks`` when ``sharded``."""
    return nbytes / ranks if sharded and ranks > 1 else nbytes


def effective_stage(zero_stage: int, ranks: int) -> int:
    """One rank trains without DeepSpeed (``common.train.engine``'s plain backend): stage 0."""
    return zero_stage if ranks > 1 else 0


def weight_bytes(params: int, stage: int, ranks: int, dtype_bytes: int = 2) -> float:
    """The model's weights on one rank; ZeRO-3 shards them."""
    return shard(params * dtype_bytes, ranks, stage >= 3)


def optimizer_bytes(trained: int, stage: int, ranks: int, master: bool) -> float:
    """fp32 Adam m, v (and an fp32 master copy of bf16 weights); ZeRO-1 and up shard them."""
    per = ADAM_STATE_BYTES + (MASTER_BYTES if master else 0)
    return shard(trained * per, ranks, stage >= 1)


def gradient_bytes(trained: int, stage: int, ranks: int, grad_bytes: int) -> float:
    """Gradients of the trained weights; ZeRO-2 and up shard them."""
    return shard(trained * grad_bytes, ranks, stage >= 2)


def zero_buffer_bytes(params: int, stage: int, dtype_bytes: int) -> float:
    """DeepSpeed's own buffers at its defaults: the gradient reduce bucket (stages 2 and 3, in
    the trained weights' dtype), and at stage 3 the parameters gathered at once (bf16)."""
    if stage < 2:
        return 0.0
    bucket = REDUCE_BUCKET_ELEMENTS * dtype_bytes
    live = 2 * min(params, MAX_LIVE_PARAMETERS) if stage >= 3 else 0
    return float(bucket + live)


# --------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class ActivationCost:
    """Bytes autograd saves for the backward, per row of T tokens: c0 + a·T + b·T² for one
    decoder layer and for everything outside the layers (embeddings, final norm, loss)."""

    layer: tuple[float, float, float]
    outside: tuple[float, float, float]
    hidden_size: int
    dtype_bytes: int
    saved: tuple[str, ...] = ()  # one layer's saved tensors at the longest measured T
    how: str = ""
    mask: str = "none"  # the measured batch's mask: one of ``MASKS``

    @staticmethod
    def _at(coef: tuple[float, float, float], tokens: int) -> float:
        c0, a, b = coef
        return max(0.0, c0 + a * tokens + b * tokens * tokens)

    def layer_bytes(self, tokens: int) -> float:
        return self._at(self.layer, tokens)

    def outside_bytes(self, tokens: int) -> float:
        return self._at(self.outside, tokens)

    def per_token(self, tokens: int) -> float:
        """One layer's bytes a token at sequence length ``tokens``."""
        return self.layer_bytes(tokens) / tokens


def activation_bytes(
    cost: ActivationCost, layers: int, rows: int, tokens: int, checkpointing: bool
) -> float:
    """One micro-batch of ``rows`` sequences of ``tokens``: every layer's saved tensors, or with
    checkpointing each layer's input plus one layer recomputed in the backward. The mask is in
    the measured cost: a padded batch's SDPA copy in every layer (``cost.layer``), an additive
    mask once (``cost.outside``); with checkpointing a padded batch's boolean [rows, 1, T, T]
    mask is also held for the recomputation."""
    layer, outside = cost.layer_bytes(tokens), cost.outside_bytes(tokens)
    if checkpointing:
        kept = tokens * cost.hidden_size * cost.dtype_bytes
        held = mask_bytes(rows, tokens, BOOL_MASK_ENTRY_BYTES) if cost.mask == "padding" else 0.0
        return rows * (layers * kept + layer + outside) + held
    return rows * (layers * layer + outside)


def mask_bytes(rows: int, tokens: int, entry_bytes: int = MASK_ENTRY_BYTES) -> float:
    """A [rows, 1, T, T] attention mask: HF's boolean padding mask takes 1 byte an entry, an
    additive bf16 mask (SDPA's copy of a boolean one, ARCO's block-causal one) 2."""
    return float(rows * tokens * tokens * entry_bytes)


def logits_bytes(rows: int, vocab: int) -> float:
    """The [rows, vocab] logits that exist at once, at the backward's peak."""
    return float(rows * vocab * LOGIT_ENTRY_BYTES)


def torch_config(arch: ModelArch, layers: int, vocab: int):
    """A transformers config of ``arch`` at ``layers`` layers and a ``vocab``-token vocabulary,
    SDPA attention (what the plan measures and the bare GPU check trains)."""
    import transformers

    try:
        return transformers.AutoConfig.for_model(
            arch.model_type,
            hidden_size=arch.hidden_size,
            intermediate_size=arch.intermediate_size,
            num_attention_heads=arch.num_heads,
            num_key_value_heads=arch.num_kv_heads,
            head_dim=arch.head_dim,
            num_hidden_layers=layers,
            vocab_size=vocab,
            tie_word_embeddings=arch.tied_embeddings,
            attention_bias=arch.attention_bias,
            attn_implementation="sdpa",
        )
    except ValueError as e:
        raise MemoryPlanError(
            f"{arch.name}: cannot build a {arch.model_type!r} layer to measure: {e}"
        ) from None


def _measuring_model(arch: ModelArch, lora: LoraShape | None, dtype: Any) -> Any:
    """A 2-layer model of ``arch``'s width (256-token vocabulary) in training mode, its
    adapters in fp32 as ``TrainEngine`` keeps them."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(torch_config(arch, 2, 256), dtype=dtype)
    if lora is not None:
        from common.train.lora import build_lora_model

        spec = {"r": lora.r, "lora_alpha": 2 * lora.r, "lora_dropout": lora.dropout}
        model = build_lora_model(model, {"policy": {**spec, "target_modules": list(lora.targets)}})
        for name, p in model.named_parameters():  # as TrainEngine keeps them: fp32 adapters
            if "lora_" in name:
                p.data = p.data.float()
    return model.train()


def _saved_bytes(
    arch: ModelArch,
    lora: LoraShape | None,
    tokens: int,
    dtype: Any,
    mask: str = "none",
    model: Any = None,
) -> tuple[int, int, list[str]]:
    """One forward of a 2-layer model (``model``, else ``_measuring_model``'s) over one row of
    ``tokens``: the bytes the last layer saves for the backward, the rest of the model's (all
    saved bytes less 2 x the last layer's: the first layer's extras, such as RoPE's cos/sin or
    an additive mask both layers share, count as outside; less the first layer's own where it
    saves less, as under LoRA), and the last layer's list.

    ``mask``: ``none`` (HF passes no mask), ``padding`` (the row's last token padding: HF's
    boolean 4D mask), ``additive`` (a causal additive 4D mask with position ids, as ARCO's
    shared-prefix trunks pass). Only the forward runs: what it saves is what the backward
    would read."""
    import torch

    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    model = model if model is not None else _measuring_model(arch, lora, dtype)
    # No padding: HF then passes no mask and SDPA runs its flash kernel, saving what the GPU's
    # flash / memory-efficient kernels save (no T x T weights). With a mask, CPU's SDPA runs its
    # flash kernel too (torch 2.13: it takes a mask), which saves the mask as the GPU's
    # memory-efficient kernel does, and no T x T weights.
    ids = torch.randint(0, 256, (1, tokens))
    inputs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
    if mask == "padding":
        inputs["attention_mask"][0, -1] = 0
    elif mask == "additive":
        lowest = torch.finfo(dtype).min
        causal = torch.full((tokens, tokens), lowest, dtype=dtype).triu(1)
        inputs = {"attention_mask": causal[None, None], "position_ids": torch.arange(tokens)[None]}
    given = inputs["attention_mask"].untyped_storage().data_ptr()  # saved once: outside
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    layers = model.get_decoder().layers
    last = len(layers) - 1
    where: list[int | None] = [None]
    seen: set[int] = set()
    total, in_first, in_last, shared, listed = 0, 0, 0, 0, []
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda *_, i=i: where.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda *_: where.__setitem__(0, None)))

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total, in_first, in_last, shared
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in params or ptr in seen or storage.nbytes() == 0:
            return t
        seen.add(ptr)
        if ptr == given:
            shared += storage.nbytes()
            return t
        total += storage.nbytes()
        if where[0] == 0:
            in_first += storage.nbytes()
        if where[0] == last:
            in_last += storage.nbytes()
            listed.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, use_cache=False, **inputs)
    finally:
        for handle in handles:
            handle.remove()
    # outside the layers: all less 2 x the last layer's, or less both layers' where the first
    # saves less than the last (a frozen base: its input needs no gradient); the mask given
    outside = max(total - 2 * in_last, total - in_first - in_last) + shared
    return in_last, outside, listed


def _fit(points: Sequence[tuple[int, float]]) -> tuple[float, float, float]:
    """c0 + a·T + b·T² through three (T, bytes) points."""
    import numpy as np

    t = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    coef = np.linalg.solve(np.stack([np.ones_like(t), t, t * t], axis=1), y)
    # drop what is float noise of an exact count: a term whose share of the bytes at the longest
    # T is below 1e-8 (a real one, such as a mask's 2 bytes/T^2, is far above)
    scale = max(abs(y).max(), 1.0)
    top = t.max()
    return tuple(float(v) if abs(v) * top**k > 1e-8 * scale else 0.0 for k, v in enumerate(coef))


def measure_activation_cost(
    arch: ModelArch,
    lora: LoraShape | None = None,
    tokens: tuple[int, int, int] = (32, 64, 128),
    dtype_name: str = "bfloat16",
    mask: str = "none",
) -> ActivationCost:
    """Measure what one decoder layer of ``arch`` (and the rest of the model) saves for the
    backward, on CPU, at the real width and a 256-token vocabulary, on a row masked as ``mask``
    says (``_saved_bytes``). Cached in memory per width (the name, depth and vocabulary of
    ``arch`` do not change it)."""
    width = dataclasses.replace(arch, name="", source="", num_layers=2, vocab_size=256)
    return _measure(width, lora, tokens, dtype_name, mask)


@functools.lru_cache(maxsize=32)
def _measure(
    arch: ModelArch,
    lora: LoraShape | None,
    tokens: tuple[int, int, int],
    dtype_name: str,
    mask: str = "none",
) -> ActivationCost:
    import torch

    dtype = getattr(torch, dtype_name)
    model = _measuring_model(arch, lora, dtype)  # one model for the three lengths
    layer_pts, outside_pts, listed = [], [], []
    for t in tokens:
        layer, outside, listed = _saved_bytes(arch, lora, t, dtype, mask, model)
        layer_pts.append((t, layer))
        outside_pts.append((t, outside))
    kind = f"LoRA r={lora.r} on {','.join(lora.targets)}, " if lora else ""
    masked = {"none": "", "padding": ", a padding mask", "additive": ", an additive 4D mask"}
    return ActivationCost(
        layer=_fit(layer_pts),
        outside=_fit(outside_pts),
        hidden_size=arch.hidden_size,
        dtype_bytes=torch.finfo(dtype).bits // 8,
        saved=tuple(listed),
        how=(
            f"measured on CPU: one forward of a 2-layer {arch.model_type} at hidden "
            f"{arch.hidden_size}, FFN {arch.intermediate_size}, {arch.num_heads}/"
            f"{arch.num_kv_heads} heads, {kind}{dtype_name}, SDPA{masked[mask]}, T = "
            f"{', '.join(map(str, tokens))}"
        ),
        mask=mask,
    )


# --------------------------------------------------------------------------- a run's shape


@dataclass(frozen=True)
class MuRows:
    """ARCO's μ update forward for one micro-batch of trajectories (``arco.trainer.rubric_loss``):
    ``rows`` of ``tokens`` (a trajectory's packed trunk under ``rubric.shared_prefix``, else one
    padded row a step), masked as ``mask`` says (``MASKS``), logits at ``logit_rows`` positions
    (the criteria tokens, for μ's KL), and whether π's activations live beside μ's
    (``rl.mu_single_forward`` false: one backward over both)."""

    rows: int
    tokens: int
    mask: str
    logit_rows: int
    beside_pi: bool
    row_tokens: int  # the longest rubric row alone
    steps: int  # rubric rows a trajectory


@dataclass(frozen=True)
class RunShape:
    """What the formulas need from a run's config."""

    model: str
    ranks: int
    zero_stage: int
    bf16: bool
    grad_bytes: int  # of a full fine-tune's gradients under DeepSpeed
    lora: LoraShape | None
    micro_batch_size: int
    micro_batch_key: str  # the config key, for the advice
    seq_len: int
    logit_rows: int
    gradient_checkpointing: bool
    frozen_copy: bool  # a whole frozen copy of the model (KL reference, CER's frozen scorer)
    gpu_memory_utilization: float
    max_model_len: int
    sleep_during_update: bool
    rollouts_per_rank: int
    head_k: int = 0  # ARCO's scoring head outputs (0: no head)
    padded: bool = False  # the update's rows padded to the longest (a micro-batch of > 1 row)
    mu: MuRows | None = None  # ARCO's μ rows in the update (None: μ not trained, or no ARCO)
    vllm_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS  # engine.max_num_batched_tokens
    vllm_max_seqs: int = VLLM_MAX_NUM_SEQS  # engine.max_num_seqs


def deepspeed_grad_bytes(train: Any) -> int:
    """Bytes of a bf16 model's gradient under the engine's own DeepSpeed config: 4 when it sets
    ``data_types.grad_accum_dtype`` fp32, else the model dtype's 2."""
    from common.train.engine import deepspeed_config

    dtype = deepspeed_config(train, True).get("data_types", {}).get("grad_accum_dtype")
    return 4 if str(dtype).lower() in ("fp32", "float32", "float") else 2


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _text_tokens(text: str) -> int:
    """Tokens of a template's ``text``, at ``RUBRIC_CHARS_PER_TOKEN`` characters a token."""
    return _ceil_div(len(text), RUBRIC_CHARS_PER_TOKEN)


def mu_rows(cfg: Any, micro: int) -> MuRows | None:
    """μ's rows in an ARCO config's update (``arco.rubrics``: ``trunk_batch`` / ``rubric_batch``),
    at its longest lengths; None when μ is not trained in RL (``mu_frozen``: frozen μ, the PRM
    baseline, outcome-only, an external step scorer)."""
    rl, r, mode = cfg.rl, cfg.rubric, cfg.rubric_mode
    if cfg.mu_frozen:
        return None
    steps = cfg.env.max_searches + 1  # run_agent's budget: max_searches turns and a last one
    criteria = 0 if mode == "none" else r.max_new_tokens
    request = ""
    if mode != "none" and r.request:
        example = json.dumps({"criteria": ["..."] * r.k}, ensure_ascii=False)
        request = r.request.format(k=r.k, example=example)
    system = _text_tokens(r.system.format(task=r.task))
    asked = _text_tokens(request)
    # the longest row: a whole trajectory (at most π's context), μ's templates and criteria
    row = cfg.agent.max_context + system + asked + criteria + RUBRIC_LABEL_TOKENS
    if r.shared_prefix:  # each other row after its branch point: budget, action, request, criteria
        tail = cfg.agent.max_turn_tokens + criteria + RUBRIC_LABEL_TOKENS
        tail += asked if r.request_in == "user" else 0
        rows, tokens, mask = micro, row + (steps - 1) * tail, "additive"
    else:
        rows, tokens = micro * steps, row
        mask = "padding" if rows > 1 else "none"
    kl = rl.mu_kl_coef > 0 and mode == "adaptive"  # logits only where μ wrote the criteria
    return MuRows(
        rows=rows,
        tokens=tokens,
        mask=mask,
        logit_rows=micro * steps * criteria if kl else 0,
        beside_pi=not rl.mu_single_forward,
        row_tokens=row,
        steps=steps,
    )


def run_shape(cfg: Any, ranks: int) -> RunShape:
    """The shape of a loaded run config: a search-agent RL loop (EviBack, the reference GRPO
    loop), CER (``max_prompt_tokens``) or ARCO (``rl`` and ``lora``), told apart by their keys."""
    train, engine = cfg.train, cfg.engine
    assets = getattr(cfg, "assets", None)
    model = getattr(assets, "model", "") or getattr(cfg, "model", "")
    lora, head_k, frozen_copy, mu = None, 0, False, None
    if hasattr(cfg, "rl") and hasattr(cfg, "lora"):  # ARCO: π and μ adapters, μ's head
        micro, key = cfg.rl.micro_batch_size, "rl.micro_batch_size"
        seq = cfg.agent.max_context
        response = (cfg.env.max_searches + 1) * cfg.agent.max_turn_tokens
        logit_rows = micro * min(seq, response)
        lora = LoraShape(
            cfg.lora.r, tuple(cfg.lora.target_modules), cfg.lora.lora_dropout, trained=2, frozen=2
        )
        head_k = cfg.rubric.k
        rollouts = max(cfg.rl.sparse_questions * cfg.rl.sparse_n, cfg.rl.dense_questions)
        mu = mu_rows(cfg, micro)
    else:
        micro, key = cfg.loss.micro_batch_size, "loss.micro_batch_size"
        if hasattr(cfg, "max_prompt_tokens"):  # CER
            seq = cfg.max_prompt_tokens + cfg.max_response_tokens
            rollouts = cfg.prompts_per_step * cfg.group_size
            frozen_copy = bool(cfg.reward.frozen_scorer)
        else:
            seq = cfg.agent.max_context
            rollouts = cfg.questions_per_step * cfg.n
        logit_rows = min(micro * seq, cfg.loss.logprob_chunk)
        frozen_copy = frozen_copy or cfg.loss.kl_coef > 0
    return RunShape(
        model=model,
        ranks=ranks,
        zero_stage=effective_stage(train.zero_stage, ranks),
        bf16=train.bf16 in (True, "auto"),  # "auto": bf16 on every GPU the papers used
        grad_bytes=deepspeed_grad_bytes(train) if ranks > 1 else 4,
        lora=lora,
        micro_batch_size=micro,
        micro_batch_key=key,
        seq_len=seq,
        logit_rows=logit_rows,
        gradient_checkpointing=train.gradient_checkpointing,
        frozen_copy=frozen_copy and lora is None,  # a LoRA reference is the base itself
        gpu_memory_utilization=engine.gpu_memory_utilization,
        max_model_len=engine.max_model_len,
        sleep_during_update=engine.sleep_during_update,
        rollouts_per_rank=_ceil_div(rollouts, ranks),
        head_k=head_k,
        padded=micro > 1,
        mu=mu,
        vllm_batched_tokens=getattr(engine, "max_num_batched_tokens", 0)
        or VLLM_MAX_NUM_BATCHED_TOKENS,
        vllm_max_seqs=getattr(engine, "max_num_seqs", 0) or VLLM_MAX_NUM_SEQS,
    )


# --------------------------------------------------------------------------- the plan


def score_head_params(hidden: int, k: int) -> int:
    """ARCO's μ head H → 512 → 128 → K with biases (``arco.rubric_model.ScoreHead``)."""
    return hidden * 512 + 512 + 512 * 128 + 128 + 128 * k + k


def vllm_weight_bytes(arch: ModelArch, lora_rank: int | None) -> float:
    """vLLM's bf16 weights, plus its LoRA slots (every linear module, ``VLLM_MAX_LORAS`` at the
    engine's ``max_lora_rank``) when LoRA is on."""
    slots = 0
    if lora_rank:
        per_layer = sum(a + b for a, b in arch.linear_shapes().values())
        slots = VLLM_MAX_LORAS * lora_rank * per_layer * arch.num_layers * 2
    return float(2 * arch.params() + slots)


def vllm_overhead_bytes(
    arch: ModelArch,
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS,
    max_num_seqs: int = VLLM_MAX_NUM_SEQS,
) -> float:
    """vLLM's non-KV memory besides weights: its profiling forward's largest activations
    (``max_num_batched_tokens`` × (gate+up, qkv, hidden) in bf16), the sampler's fp32 logits
    and probabilities for ``max_num_seqs`` rows, and its CUDA graphs. Defaults: vLLM 0.32's
    (the engine's when a config sets neither)."""
    qkv = (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
    tokens = max_num_batched_tokens * (2 * arch.intermediate_size + qkv + arch.hidden_size)
    sampler = max_num_seqs * arch.vocab_size * 4 * 2
    return float(tokens * 2 + sampler + VLLM_CUDA_GRAPH_BYTES)


@dataclass
class GpuPlan:
    """One GPU size's verdict."""

    label: str
    capacity: float
    vllm_share: float
    kv_bytes: float
    rollout_peak: float
    update_peak: float
    advice: list[str] = field(default_factory=list)

    @property
    def peak(self) -> float:
        return max(self.rollout_peak, self.update_peak)

    @property
    def fits(self) -> bool:
        return not self.advice


def _on(flag: bool) -> str:
    return "on" if flag else "off"


@dataclass
class MemoryPlan:
    """A run's memory per rank (bytes) by category, and one ``GpuPlan`` per GPU size."""

    config: str
    arch: ModelArch
    shape: RunShape
    rows: dict[str, float]  # per-rank bytes that do not depend on the GPU
    activations: dict[bool, float]  # checkpointing on / off
    cost: ActivationCost
    kv_per_token: int
    gpus: list[GpuPlan]
    notes: list[str] = field(default_factory=list)
    mu_activations: dict[bool, float] = field(default_factory=dict)  # ARCO's μ rows, on / off

    @property
    def fits(self) -> bool:
        """The run fits on every GPU size of the plan."""
        return all(g.fits for g in self.gpus)

    def fits_on(self) -> dict[str, bool]:
        return {g.label: g.fits for g in self.gpus}

    def format(self) -> str:
        """A markdown table (rows: categories; columns: GPU sizes, GiB a rank) and a verdict
        line per GPU."""
        s, a = self.shape, self.arch

        def gib(x: float) -> str:
            return f"{x / GiB:,.2f}" if x else "-"

        ckpt = "on" if s.gradient_checkpointing else "off"
        head = [
            f"Memory plan for `{self.config}`: {a.name} ({a.params() / 1e9:.2f}B parameters; "
            f"{a.source}), {s.ranks} rank(s), ZeRO-{s.zero_stage}, "
            f"{'LoRA r=' + str(s.lora.r) + ' (frozen bf16 base)' if s.lora else 'full fine-tune'}"
            f", micro-batch {s.micro_batch_size} x {s.seq_len:,} tokens, checkpointing {ckpt}, "
            f"vLLM {s.gpu_memory_utilization:g} of the GPU"
            f"{', asleep during the update' if s.sleep_during_update else ', awake in the update'}",
            "",
            "| GiB per rank | " + " | ".join(g.label for g in self.gpus) + " |",
            "|---|" + "---:|" * len(self.gpus),
        ]

        def row(name: str, values: Sequence[float] | float) -> str:
            vals = values if isinstance(values, Sequence) else [values] * len(self.gpus)
            return f"| {name} | " + " | ".join(gib(v) for v in vals) + " |"

        lines = head + [row(k, v) for k, v in self.rows.items()]
        whose = "π's " if s.mu is not None else ""
        used = {s.gradient_checkpointing: " (in use)", not s.gradient_checkpointing: ""}
        for ckpt, value in self.activations.items():
            lines.append(row(f"{whose}activations, checkpointing {_on(ckpt)}{used[ckpt]}", value))
        if s.mu is not None and self.mu_activations:
            rows_of = f"μ's {s.mu.rows} x {s.mu.tokens:,}-token rows"
            for ckpt, value in self.mu_activations.items():
                lines.append(row(f"{rows_of}, checkpointing {_on(ckpt)}{used[ckpt]}", value))
        lines += [
            row(f"vLLM share ({s.gpu_memory_utilization:g} x GPU)", [g.vllm_share for g in self.gpus]),
            row("  of which KV cache", [g.kv_bytes for g in self.gpus]),
            row("rollout phase peak (vLLM awake)", [g.rollout_peak for g in self.gpus]),
            row("update phase peak", [g.update_peak for g in self.gpus]),
            row("GPU memory", [g.capacity for g in self.gpus]),
            "",
        ]  # fmt: skip
        for g in self.gpus:
            tokens = int(max(g.kv_bytes, 0) // self.kv_per_token)
            kv = (
                f"KV cache {tokens:,} tokens = {tokens // s.max_model_len} sequence(s) of "
                f"{s.max_model_len:,} for the rank's {s.rollouts_per_rank} rollouts"
            )
            if g.fits:
                lines.append(
                    f"- {g.label}: fits with {(g.capacity - g.peak) / GiB:,.1f} GiB to spare; {kv}"
                )
            else:
                need = (
                    f"needs {g.peak / GiB:,.1f} GiB of {g.capacity / GiB:,.1f}; "
                    if g.peak > g.capacity
                    else ""
                )
                lines.append(f"- {g.label}: does not fit: {need}{'; '.join(g.advice)}; {kv}")
        lines += ["", *[f"Note: {n}" for n in self.notes]]
        return "\n".join(lines)


def full_training_bytes(
    params: int, stage: int, ranks: int, bf16: bool, grad_bytes: int
) -> dict[str, float]:
    """A full fine-tune's resident terms on one rank at (effective) ZeRO ``stage``: its weights
    (bf16 or fp32), the optimizer states (fp32 Adam m, v and, under bf16, fp32 masters), the
    gradients (``grad_bytes`` a parameter under bf16, else fp32) and ZeRO's buffers."""
    wbytes = 2 if bf16 else 4
    return {
        "weights": weight_bytes(params, stage, ranks, wbytes),
        "optimizer": optimizer_bytes(params, stage, ranks, master=bf16),
        "gradients": gradient_bytes(params, stage, ranks, grad_bytes if bf16 else 4),
        "zero_buffers": zero_buffer_bytes(params, stage, wbytes),
    }


def update_terms(
    arch: ModelArch,
    *,
    rows: int,
    tokens: int,
    zero_stage: int,
    ranks: int,
    gradient_checkpointing: bool,
    bf16: bool,
    padded: bool,
    logprob_chunk: int = LOGPROB_CHUNK,
) -> dict[str, float]:
    """Bytes per rank of one full-parameter training model's update (no LoRA, no vLLM, no
    frozen copy, no ``CUDA_RESERVED_BYTES``): ``weights`` after the load, ``optimizer`` (fp32
    masters under bf16 and Adam m, v, as the engine holds them: ZeRO at ``zero_stage`` over
    ``ranks``, the plain backend on one rank), ``gradients`` (fp32 on one rank; DeepSpeed's
    ``grad_accum_dtype`` from the engine's own config), ``zero_buffers``, ``activations`` of one
    micro-batch of ``rows`` x ``tokens`` (padded: with a padding mask; checkpointed or not),
    ``logits`` (``logprob_chunk`` positions at a time) and ``peak``, their sum. Pure but for the
    activation measurement (``measure_activation_cost``, cached per width)."""
    stage = effective_stage(zero_stage, ranks)
    grad_bytes = 4
    if ranks > 1 and bf16:
        from common.train.config import TrainConfig

        grad_bytes = deepspeed_grad_bytes(TrainConfig(zero_stage=zero_stage))
    terms = full_training_bytes(arch.params(), stage, ranks, bf16, grad_bytes)
    cost = measure_activation_cost(
        arch,
        None,
        dtype_name="bfloat16" if bf16 else "float32",
        mask="padding" if padded else "none",
    )
    terms["activations"] = activation_bytes(
        cost, arch.num_layers, rows, tokens, gradient_checkpointing
    )
    terms["logits"] = logits_bytes(min(rows * tokens, logprob_chunk), arch.vocab_size)
    terms["peak"] = sum(terms.values())
    return terms


def make_plan(
    config: str,
    arch: ModelArch,
    shape: RunShape,
    cost: ActivationCost,
    gpu_bytes: Mapping[str, float] = GPUS,
    mu_cost: ActivationCost | None = None,
) -> MemoryPlan:
    """The plan from the architecture, the run's shape and a measured activation cost (π's
    rows; ``mu_cost``: μ's rows', needed when ``shape.mu`` is set)."""
    s, ranks, stage = shape, shape.ranks, shape.zero_stage
    params = arch.params()
    if s.lora is not None:
        lora = dataclasses.replace(
            s.lora, extra_trained=score_head_params(arch.hidden_size, s.head_k)
        )
        trained = lora.trained_params(arch)
        adapters = (lora.trained + lora.frozen) * lora.adapter_params(arch) + lora.extra_trained
        weights = weight_bytes(params, stage, ranks) + adapters * 4
        optimizer = optimizer_bytes(trained, stage, ranks, master=False)
        grads = gradient_bytes(trained, stage, ranks, 4)
        buffers = zero_buffer_bytes(params, stage, 4)
        what = "weights (bf16 base, fp32 adapters and head)"
    else:
        full = full_training_bytes(params, stage, ranks, s.bf16, s.grad_bytes)
        weights, optimizer = full["weights"], full["optimizer"]
        grads, buffers = full["gradients"], full["zero_buffers"]
        what = f"weights ({'bf16' if s.bf16 else 'fp32'}{', ZeRO-3 shard' if stage >= 3 else ''})"
    frozen = 2.0 * params if s.frozen_copy else 0.0
    grad_kind = "fp32" if s.lora or s.grad_bytes == 4 or not s.bf16 else "bf16"
    logits = logits_bytes(s.logit_rows, arch.vocab_size)
    rows = {
        what: weights,
        f"optimizer states (fp32 Adam m, v{', master' if s.bf16 and not s.lora else ''})": optimizer,
        "frozen copy (KL reference / frozen scorer)": frozen,
        f"gradients ({grad_kind})": grads,
        "ZeRO buckets and gathered params": buffers,
        f"logits ({s.logit_rows:,} positions x {arch.vocab_size:,})": logits,
    }
    activations = {
        ckpt: activation_bytes(cost, arch.num_layers, s.micro_batch_size, s.seq_len, ckpt)
        for ckpt in (True, False)
    }
    pi_phase = logits + activations[s.gradient_checkpointing]
    mu_activations: dict[bool, float] = {}
    mu_phase = 0.0
    if s.mu is not None:
        if mu_cost is None:
            raise MemoryPlanError(f"{config}: μ's rows need their activation cost (mu_cost)")
        mu_activations = {
            ckpt: activation_bytes(mu_cost, arch.num_layers, s.mu.rows, s.mu.tokens, ckpt)
            for ckpt in (True, False)
        }
        mu_logits = logits_bytes(s.mu.logit_rows, arch.vocab_size)
        rows[f"μ logits ({s.mu.logit_rows:,} criteria positions x {arch.vocab_size:,})"] = mu_logits
        mu_phase = mu_logits + mu_activations[s.gradient_checkpointing]
    # rl.mu_single_forward: μ's forward and backward end before π's forward; else one backward
    # over both, so both forwards' activations and logits live together
    beside = s.mu is not None and s.mu.beside_pi
    update_only = grads + buffers + (pi_phase + mu_phase if beside else max(pi_phase, mu_phase))
    resident = weights + optimizer + frozen + CUDA_RESERVED_BYTES
    kv_per_token = arch.kv_bytes_per_token()
    vllm_fixed = vllm_weight_bytes(arch, max(8, s.lora.r) if s.lora else None)
    vllm_fixed += vllm_overhead_bytes(arch, s.vllm_batched_tokens, s.vllm_max_seqs)
    gpus = []
    for label, capacity in gpu_bytes.items():
        share = s.gpu_memory_utilization * capacity
        kv = share - vllm_fixed
        in_update = VLLM_ASLEEP_BYTES if s.sleep_during_update else share
        g = GpuPlan(
            label, capacity, share, kv, resident + share, resident + update_only + in_update
        )
        if g.update_peak > capacity:
            fixes = [f"lower {s.micro_batch_key}"]
            fixes += [] if s.gradient_checkpointing else ["set train.gradient_checkpointing=true"]
            fixes += ["train.zero_stage=3"] if stage < 3 and ranks > 1 else []
            fixes += [] if s.sleep_during_update else ["engine.sleep_during_update=true"]
            g.advice.append("the update does not fit: " + ", or ".join(fixes))
        if g.rollout_peak > capacity:
            g.advice.append(
                "the rollout does not fit: lower engine.gpu_memory_utilization"
                + (" or use train.zero_stage=3" if stage < 3 and ranks > 1 else "")
            )
        if kv < s.max_model_len * kv_per_token:
            g.advice.append(
                f"vLLM's share leaves {max(kv, 0) / GiB:.1f} GiB of KV cache, less than one "
                f"{s.max_model_len:,}-token sequence: raise engine.gpu_memory_utilization or "
                "lower engine.max_model_len"
            )
        gpus.append(g)
    notes = [
        f"activations {cost.how}; one layer saves {cost.per_token(s.seq_len):,.0f} bytes a "
        f"token at T = {s.seq_len:,} ({cost.per_token(s.seq_len) / arch.hidden_size:.1f} x "
        f"hidden); quadratic term {cost.layer[2]:g} bytes/T^2 (0: no T x T tensor saved; "
        "2: a padded batch's mask, SDPA's copy in every layer)",
        f"assumed: vLLM keeps {VLLM_ASLEEP_BYTES / GiB:g} GiB asleep; its CUDA graphs "
        f"{VLLM_CUDA_GRAPH_BYTES / GiB:g} GiB and profiling activations "
        f"({s.vllm_batched_tokens:,} tokens, {s.vllm_max_seqs:,} sampler rows) sit "
        f"in its share; {CUDA_RESERVED_BYTES / GiB:g} GiB a rank for the CUDA context, NCCL "
        "and allocator slack (in the peaks)",
    ]
    if s.mu is not None and mu_cost is not None:
        how = "π's and μ's live together" if beside else "the larger of π's and μ's counts"
        notes.append(
            f"μ's update rows: {s.mu.rows} x {s.mu.tokens:,} tokens a micro-batch ("
            + (
                f"a trajectory's {s.mu.steps} rubric rows packed, the longest "
                f"{s.mu.row_tokens:,} tokens whole"
                if s.mu.mask == "additive"
                else f"{s.mu.steps} rubric rows a trajectory, each padded to {s.mu.row_tokens:,}"
            )
            + f"; assumed: templates at {RUBRIC_CHARS_PER_TOKEN} characters a token, "
            f"{RUBRIC_LABEL_TOKENS} tokens of labels); in the update's peak {how} "
            f"(rl.mu_single_forward={'false' if beside else 'true'}); {mu_cost.how}"
        )
    if s.lora is None and s.bf16 and s.ranks > 1:
        notes.append(
            f"gradients in {'fp32' if s.grad_bytes == 4 else 'bf16'}: the engine's DeepSpeed "
            "config"
            + (
                " sets grad_accum_dtype fp32"
                if s.grad_bytes == 4
                else " sets no fp32 grad_accum_dtype"
            )
        )
    return MemoryPlan(
        config, arch, shape, rows, activations, cost, kv_per_token, gpus, notes, mu_activations
    )


def _gpu_bytes(gpu_gib: Mapping[str, float] | Sequence[float] | float | None) -> dict[str, float]:
    if gpu_gib is None:
        return dict(GPUS)
    if isinstance(gpu_gib, Mapping):
        return {k: float(v) * GiB for k, v in gpu_gib.items()}
    values = [gpu_gib] if isinstance(gpu_gib, int | float) else list(gpu_gib)
    return {f"{v:g} GiB": float(v) * GiB for v in values}


# (arch, lora, mask=...) -> the activation cost; ``measure_activation_cost``'s signature
Measure = Callable[..., ActivationCost]


def plan_for_run(
    cfg: Any,
    ranks: int = DEFAULT_RANKS,
    gpu_gib: Mapping[str, float] | Sequence[float] | float | None = None,
    *,
    label: str = "",
    measure: Measure | None = None,
) -> MemoryPlan:
    """The plan of a loaded run config (``EviBackConfig``, ``CERConfig``, ``ArcoConfig``, the
    reference loop's ``GRPOConfig``) on ``ranks`` ranks. ``gpu_gib``: GPU sizes in GiB (a
    number, a list, or label -> GiB); default the 80 GB and 141 GB GPUs of ``GPUS``. A
    trainer can pass its device's memory and refuse to start when ``plan.fits`` is false.
    ``measure``: the activation cost of a width, called as ``measure(arch, lora, mask=...)``
    (default ``measure_activation_cost``)."""
    if ranks < 1:
        raise MemoryPlanError(f"ranks must be >= 1, got {ranks}")
    shape = run_shape(cfg, ranks)
    arch = model_arch(shape.model)
    measure = measure or measure_activation_cost
    lora = _measured_lora(shape.lora)
    cost = measure(arch, lora, mask="padding" if shape.padded else "none")
    mu_cost = measure(arch, lora, mask=shape.mu.mask) if shape.mu is not None else None
    return make_plan(label or shape.model, arch, shape, cost, _gpu_bytes(gpu_gib), mu_cost)


def announce_plan(cfg: Any) -> MemoryPlan | None:
    """A trainer's word before any model loads, on a GPU: rank 0 prints ``cfg``'s plan for this
    GPU and the 80 GB and 141 GB ones, on the launcher's rank count, and one warning line when it
    does not fit here (a warning, not a refusal: the plan is at the config's longest lengths).
    Nothing on a CPU, where it says nothing about the run; a plan that cannot be made is one
    line, never an error."""
    import os

    import torch

    if not torch.cuda.is_available() or int(os.environ.get("RANK", "0")) != 0:
        return None
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    here = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    gpus = {"this GPU": here / GiB} | {k: v / GiB for k, v in GPUS.items()}
    try:
        plan = plan_for_run(cfg, ranks, gpus)
    except Exception as err:  # noqa: BLE001 -- a report before the run, never its end
        print(f"[memory plan] not made ({type(err).__name__}: {err})", flush=True)
        return None
    print(plan.format(), flush=True)
    if not plan.fits_on().get("this GPU", True):
        print(
            f"[memory plan] WARNING: at its longest lengths this run does not fit on this GPU "
            f"({here / GiB:.0f} GiB, {ranks} rank(s)); see the plan above",
            flush=True,
        )
    return plan


def _measured_lora(lora: LoraShape | None) -> LoraShape | None:
    """The adapter one training forward runs through (one at a time, whatever the count)."""
    return None if lora is None else LoraShape(lora.r, lora.targets, lora.dropout)


# The config class of each package's configs, by the folder a config file lies in. Named by
# string (as ``common.rewards.load_part`` names a config's parts): ``common`` imports no method
# package; this resolves only what the user's --config points at.
CONFIG_CLASSES = {
    "arco": "arco.config:ArcoConfig",
    "cer": "cer.config:CERConfig",
    "eviback": "eviback.config:EviBackConfig",
    "common": "common.search_grpo:GRPOConfig",
}


def config_class(path: str | Path) -> type:
    """The config class for the config file at ``path`` (by its package folder)."""
    parts = Path(path).resolve().parts
    found = [p for p in parts if p in CONFIG_CLASSES]
    if not found:
        raise MemoryPlanError(
            f"{path}: not under arco/, cer/, eviback/ or common/; cannot tell its config class"
        )
    module, _, name = CONFIG_CLASSES[found[-1]].partition(":")
    return getattr(importlib.import_module(module), name)


def plan_for_config(
    path: str | Path,
    ranks: int = DEFAULT_RANKS,
    gpu_gib: Mapping[str, float] | Sequence[float] | float | None = None,
    overrides: Sequence[str] = (),
    *,
    measure: Measure | None = None,
) -> MemoryPlan:
    """The plan of the config file at ``path`` (with dotted ``overrides``); no model loads."""
    from common.config import load_config

    cfg = load_config(config_class(path), path, overrides)
    return plan_for_run(cfg, ranks, gpu_gib, label=str(path), measure=measure)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the plan. Exit 0 when it fits on every GPU size, 1 when not, 2 on a bad input."""
    p = argparse.ArgumentParser(
        prog="python -m common.train.memory_plan",
        description="GPU memory per rank of a run config, before any model loads.",
    )
    p.add_argument(
        "--config", required=True, help="a run config, e.g. cer/configs/qwen3_8b_base_math.yaml"
    )
    p.add_argument("--ranks", type=int, default=DEFAULT_RANKS, help="data-parallel ranks (GPUs)")
    p.add_argument(
        "--gpu-gib",
        type=float,
        action="append",
        help="a GPU size in GiB, repeatable (default: the 80 GB and 141 GB GPUs)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.micro_batch_size=1")
    args = p.parse_args(argv)
    from common.config import ConfigError

    try:
        plan = plan_for_config(args.config, args.ranks, args.gpu_gib, args.overrides)
    except (ConfigError, MemoryPlanError) as e:
        print(f"memory_plan: {e}", file=sys.stderr)
        return 2
    print(plan.format())
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
