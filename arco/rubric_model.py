"""ARCO's model: one frozen base, LoRA adapters for the policy π and the rubric model μ, their
frozen references, and μ's scoring head (arco/README.md, "The method").

    base (frozen, one copy) ─┬─ adapter "policy"      π      (trained)
                             ├─ adapter "rubric"      μ      (trained) ──> mean-pooled last hidden
                             ├─ adapter "policy_ref"  π_ref  (frozen copy after warmup)      │
                             └─ adapter "rubric_ref"  μ_ref  (frozen copy after warmup)      v
                                                                    head: H→512→128→K, tanh (fp32)

π_ref and μ_ref are copies of the adapters, never of the base: a reference forward is the base
under a frozen adapter, always in eval mode (no LoRA dropout). ``ArcoModel.forward(adapter, ...)``
runs one of the four; under ``TrainEngine`` it is the engine's training forward (DeepSpeed sees
the whole module).

Precision: with bf16 on, the base runs in bf16 while the four adapters and the head stay fp32
(``fp32_parameter``; peft's own default for adapters, and the release's head), so the trained
weights are stepped in fp32 and the head computes in fp32 on the pooled hidden state. The base is
loaded in its dtype (no fp32 copy first), and the rotary frequencies (``ROTARY_BUFFERS``) stay
fp32 whatever the module is cast to: in bf16 they would shift RoPE angles by radians at long
positions, away from what vLLM computes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from common.config import ConfigError
from common.train.export import iter_named_weights
from common.train.lora import build_lora_model

TRAINED = ("policy", "rubric")
REFERENCE = {"policy": "policy_ref", "rubric": "rubric_ref"}
META_FILE = "arco.json"
HEAD_FILE = "rubric_head/head.safetensors"  # in a subfolder: vLLM loads every top-level one
ROTARY_BUFFERS = ("inv_freq", "original_inv_freq")  # HF's rotary embeddings: fp32 always


class ScoreHead(nn.Module):
    """d = tanh(W3 · GELU(W2 · GELU(W1 · h))), H → 512 → 128 → K, always in float32."""

    def __init__(self, hidden_size: int, k: int):
        super().__init__()
        self.k = k
        self.net = nn.Sequential(
            nn.Linear(hidden_size, 512),
            nn.GELU(),
            nn.Linear(512, 128),
            nn.GELU(),
            nn.Linear(128, k),
            nn.Tanh(),
        ).float()

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(pooled.float())  # [B, H] -> [B, K] in [-1, 1]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, T, H] over the positions where ``mask`` [B, T] is 1 -> [B, H] in
    float32 (a bf16 sum over a thousand positions would lose the mean's low bits). A mask
    [B, R, T] pools R sets of positions of each row -> [B, R, H] (the shared-prefix path: one
    packed row holds a trajectory's rubric sequences)."""
    if mask.dim() == 3:
        m = mask.float()  # [B, R, T]
        return torch.bmm(m, hidden.float()) / m.sum(-1, keepdim=True).clamp(min=1.0)
    m = mask.float().unsqueeze(-1)
    return (hidden.float() * m).sum(1) / m.sum(1).clamp(min=1.0)


class ArcoModel(nn.Module):
    """The peft model (base + four adapters) and the scoring head, as one module."""

    def __init__(self, lm: nn.Module, head: ScoreHead, lora: Mapping[str, Any]):
        super().__init__()
        self.lm = lm
        self.head = head
        self.lora = dict(lora)
        self.rubric_meta: dict[str, Any] | None = None  # rubric mode/prefix μ was trained under
        for name, p in self.lm.named_parameters():
            p.requires_grad_(_trained_lora(name))
        self._trainable = {n for n, p in self.named_parameters() if p.requires_grad}

    @property
    def k(self) -> int:
        return self.head.k

    @staticmethod
    def fp32_parameter(name: str) -> bool:
        """Weights kept in fp32 under bf16 (``TrainEngine``): every adapter's and the head's."""
        return name.startswith("head.") or "lora_" in name

    def gradient_checkpointing_enable(
        self, gradient_checkpointing_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Recompute each decoder layer's activations in backward (``TrainEngine`` calls it under
        ``train.gradient_checkpointing``): the HF backbone's own checkpointing (default
        ``use_reentrant=False``; HF also makes the embeddings' output require grad, as a frozen
        base under reentrant checkpointing needs), each layer recomputed under the adapter its
        forward ran under. Active in train mode only (HF's rule)."""
        kwargs = gradient_checkpointing_kwargs or {"use_reentrant": False}
        hf = self.lm.get_base_model()
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        for module in hf.modules():  # the checkpoint function HF has just given each layer
            if getattr(module, "gradient_checkpointing", False):
                module._gradient_checkpointing_func = self._under_forward_adapter(
                    module._gradient_checkpointing_func
                )

    def _under_forward_adapter(self, checkpoint: Callable[..., Any]) -> Callable[..., Any]:
        """``checkpoint`` with the layer recomputed under the adapter active at its forward: π's
        and μ's forwards share the layers and one backward takes a loss over both, when only the
        last forward's adapter is active (recomputing π's layers under μ gives wrong gradients)."""

        def run(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            adapter = self.lm.active_adapter

            def under_adapter(*a: Any, **k: Any) -> Any:
                current = self.lm.active_adapter
                if current == adapter:  # the forward itself, or a backward of one adapter
                    return function(*a, **k)
                self.use(adapter)
                try:
                    return function(*a, **k)
                finally:
                    self.use(current)

            return checkpoint(under_adapter, *args, **kwargs)

        return run

    def gradient_checkpointing_disable(self) -> None:
        self.lm.get_base_model().gradient_checkpointing_disable()

    def _apply(self, fn: Any, recurse: bool = True) -> ArcoModel:
        """``nn.Module.to`` / ``.bfloat16()`` / ``.cuda()``, the rotary buffers moved but never
        cast: they stay fp32 (a cast to bf16 and back would not restore them)."""
        kept = {n: b for n, b in self.named_buffers() if n.rsplit(".", 1)[-1] in ROTARY_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in kept.items():
            owner, _, leaf = name.rpartition(".")
            module = self.get_submodule(owner)
            new = module._buffers[leaf]
            if new is not None and new.dtype != old.dtype:
                module._buffers[leaf] = old.to(new.device)
        return self

    def use(self, adapter: str) -> None:
        """Route forwards through ``adapter``; the trainable set never changes (peft would
        otherwise make the active adapter trainable and freeze the others)."""
        self.lm.set_adapter(adapter)
        for name, p in self.named_parameters():
            p.requires_grad_(name in self._trainable)

    def forward(
        self,
        adapter: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pool_mask: torch.Tensor | None = None,
        logit_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits under ``adapter``, and with ``pool_mask`` [B, T] the head's scores [B, K] on
        the mean-pooled last hidden layer over it ([B, R, T]: scores [B, R, K]). A reference
        adapter runs in eval mode (no dropout), whatever the module's mode.

        ``attention_mask`` [B, T], or a 4D additive mask [B, 1, T, T] with ``position_ids``
        [B, T] (packed rows, ``common.block_causal``).

        Logits: [B, T, V] at every position; with ``logit_mask`` [B, T] only at its positions,
        [n, V] in row-major order (``x[logit_mask]``): the language-model head is applied to
        those hidden states alone, so no [B, T, V] tensor exists (n = 0 gives [0, V])."""
        self.use(adapter)
        reference = adapter in REFERENCE.values()
        was_training = self.training
        if reference:
            self.eval()
        try:
            if logit_mask is None:
                out = self.lm(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    output_hidden_states=pool_mask is not None,
                    use_cache=False,
                )
                logits, hidden = (
                    out.logits,
                    out.hidden_states[-1] if pool_mask is not None else None,
                )
            else:
                hf = self.lm.get_base_model()
                body = getattr(hf, hf.base_model_prefix)  # the decoder, under the LoRA layers
                hidden = body(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                ).last_hidden_state
                logits = hf.get_output_embeddings()(hidden[logit_mask.bool()])  # [n, V]
        finally:
            if reference:
                self.train(was_training)
        scores = None
        if pool_mask is not None:
            scores = self.head(mean_pool(hidden, pool_mask))
        return logits, scores

    def freeze_rubric(self) -> None:
        """μ out of training (frozen μ, the PRM baseline, outcome-only): the rubric adapter and
        the head stop requiring gradients, so no loss can reach them and no optimizer holds them."""
        for name, p in self.named_parameters():
            if name.startswith("head.") or (name.startswith("lm.") and ".rubric." in name):
                p.requires_grad_(False)
                self._trainable.discard(name)

    def groups(self, lrs: Mapping[str, float]) -> list[dict[str, Any]]:
        """AdamW parameter groups: ``policy`` (π's adapter), ``rubric`` (μ's adapter) and
        ``head``, at the rates in ``lrs``; a group left without trainable parameters is left
        out."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        parts = {
            "policy": [p for n, p in named if n.startswith("lm.") and ".policy." in n],
            "rubric": [p for n, p in named if n.startswith("lm.") and ".rubric." in n],
            "head": [p for n, p in named if n.startswith("head.")],
        }
        clip = {"policy": "policy", "rubric": "rubric", "head": "rubric"}  # π and μ apart
        return [
            {"name": k, "params": v, "lr": lrs[k], "clip": clip[k]} for k, v in parts.items() if v
        ]

    @torch.no_grad()
    def sync_references(self) -> None:
        """π_ref ← π and μ_ref ← μ (at the end of warmup, or when loading its output)."""
        params = dict(self.lm.named_parameters())
        for name, p in params.items():
            for trained, ref in REFERENCE.items():
                if f".{ref}." in name:
                    p.copy_(params[name.replace(f".{ref}.", f".{trained}.")])

    def write_checkpoint_files(self, folder: Path, is_main: bool) -> None:
        """Adapters (peft folders), the head, and the policy merged into a plain HF model (for
        evaluation with any engine); the base weights are the merged model's, nothing else."""
        if not is_main:
            return
        save_arco(self, folder)
        merged = dict(iter_named_weights(self.lm, merge_lora=True, adapter="policy"))
        merged = {n: t.detach().to("cpu", copy=True) for n, t in merged.items()}
        self.lm.get_base_model().save_pretrained(folder, state_dict=merged, safe_serialization=True)


def _trained_lora(param_name: str) -> bool:
    return "lora_" in param_name and any(f".{a}." in param_name for a in TRAINED)


def build_arco_model(
    base_path: str | Path,
    lora: Mapping[str, Any],
    k: int,
    init_from: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
) -> ArcoModel:
    """The base at ``base_path`` with the four adapters and a head for ``k`` scores.

    ``dtype``: the base's, loaded straight in it (the adapters and the head are fp32 whatever it
    is; the rotary buffers too).
    ``init_from``: a folder written by ``save_arco`` (warmup output, checkpoint); its policy and
    rubric adapters and head are loaded, its LoRA settings and K win over ``lora``/``k``, and the
    references become copies of the loaded adapters. Without it: fresh adapters (B = 0, so π = μ
    = base) and a fresh head.
    """
    from transformers import AutoModelForCausalLM

    meta = read_meta(init_from) if init_from else {"lora": dict(lora), "k": k}
    if init_from:  # every file read before the base loads: a damaged folder costs nothing
        folder = Path(init_from)
        states = {name: read_adapter(folder, name) for name in TRAINED}
        head_state = _read_weights(folder / HEAD_FILE, "scoring head", folder)
    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=dtype)
    spec = meta["lora"]
    lm = build_lora_model(base, {name: spec for name in (*TRAINED, *REFERENCE.values())})
    head = ScoreHead(base.config.hidden_size, int(meta["k"]))
    if init_from:
        load_adapters(lm, folder, TRAINED, states)
        try:
            head.load_state_dict(head_state)
        except RuntimeError as err:  # another K or hidden size than arco.json says
            raise ArcoFolderError(
                f"{folder / HEAD_FILE}: the scoring head does not fit ({_one_line(err)}); "
                f"{_redo(folder)}"
            ) from None
    model = ArcoModel(lm, head, spec)
    for name, p in model.named_parameters():  # adapters and head in fp32 over a bf16 base
        if model.fp32_parameter(name):
            p.data = p.data.float()
    model.rubric_meta = meta.get("rubric")
    model.sync_references()
    model.use("policy")
    return model


class ArcoFolderError(ConfigError):
    """An ARCO folder (warmup output or checkpoint) with a missing or unreadable file: one line
    naming the file and what to do (rerun the warmup, or resume from another checkpoint)."""


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def _redo(folder: Path) -> str:
    """What to do about a damaged ARCO folder: a checkpoint or a warmup output."""
    if (folder / "trainer_state.json").is_file() or folder.parent.name == "checkpoints":
        return (
            f"the checkpoint {folder} is damaged: remove it (a run resumes from the one before) "
            "or pass another checkpoint"
        )
    return f"rerun the warmup (`python -m arco warmup warmup_dir={folder}`)"


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text[:200]}"


def _read_weights(path: Path, what: str, folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors file ``path``, or an ``ArcoFolderError`` naming it."""
    if not path.is_file():
        raise ArcoFolderError(f"{path}: {what} is missing; {_redo(folder)}")
    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # truncated, or not a safetensors file
        raise ArcoFolderError(
            f"{path}: unreadable {what} ({_one_line(err)}); {_redo(folder)}"
        ) from None


def read_adapter(folder: str | Path, name: str) -> dict[str, torch.Tensor]:
    """The peft state of adapter ``name`` of the ARCO folder ``folder``."""
    folder = Path(folder)
    return _read_weights(folder / "adapters" / name / ADAPTER_WEIGHTS, f"adapter {name!r}", folder)


def load_adapters(
    lm: nn.Module,
    folder: str | Path,
    names: Sequence[str],
    states: Mapping[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """The adapters ``names`` of the ARCO folder ``folder`` (``adapters/<name>/``) into ``lm``
    (``states``: those already read). A missing, unreadable or ill-fitting adapter file is an
    ``ArcoFolderError`` naming it."""
    from peft import set_peft_model_state_dict

    folder = Path(folder)
    for name in names:
        weights = folder / "adapters" / name / ADAPTER_WEIGHTS
        state = states[name] if states and name in states else read_adapter(folder, name)
        try:
            result = set_peft_model_state_dict(lm, state, adapter_name=name)
        except RuntimeError as err:  # shapes of another LoRA rank or model
            raise ArcoFolderError(
                f"{weights}: adapter {name!r} does not fit this model ({_one_line(err)}); "
                f"{_redo(folder)}"
            ) from None
        missing = [m for m in result.missing_keys if f".{name}." in m and "lora_" in m]
        if missing:
            raise ArcoFolderError(
                f"{weights}: adapter {name!r} lacks {missing[:3]}...; {_redo(folder)}"
            )


def read_meta(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: not an ARCO model folder (write one with `python -m arco warmup`)"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        int(meta["k"])
        dict(meta["lora"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ArcoFolderError(
            f"{path}: unreadable ARCO settings ({_one_line(err)}); {_redo(Path(folder))}"
        ) from None
    return meta


def save_arco(model: ArcoModel, folder: str | Path) -> Path:
    """``adapters/<name>/`` (peft format, all four), ``rubric_head/head.safetensors`` and
    ``arco.json`` (LoRA settings, K, and ``model.rubric_meta``: the rubric settings μ was
    trained under, when known)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.lm.save_pretrained(
        str(folder / "adapters"),
        selected_adapters=[*TRAINED, *REFERENCE.values()],
        safe_serialization=True,
    )
    (folder / HEAD_FILE).parent.mkdir(exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()},
        str(folder / HEAD_FILE),
    )
    meta = {"lora": _plain(model.lora), "k": model.k}
    if model.rubric_meta is not None:
        meta["rubric"] = _plain(model.rubric_meta)
    (folder / META_FILE).write_text(json.dumps(meta, indent=1))
    return folder


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def adapter_folder(model: ArcoModel, name: str, folder: str | Path) -> Path:
    """One adapter alone as a peft folder (what a vLLM ``LoRARequest`` loads)."""
    folder = Path(folder)
    model.lm.save_pretrained(str(folder), selected_adapters=[name], safe_serialization=True)
    sub = folder / name
    return sub if sub.is_dir() else folder
