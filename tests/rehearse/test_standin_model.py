"""The stand-in model (experiments/rehearse/standin.py): the real architecture class and vocabulary,
sampling that follows a scripted token chain (HF logits, HF sampling, vLLM), non-zero LoRA
gradients, and the standin.json record."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, Qwen3ForCausalLM

from common.train import build_lora_model
from experiments.rehearse.standin import (
    MARGIN,
    UNSCRIPTED_LOGIT,
    build_standin,
    chain_from_paths,
    successors,
)
from experiments.rehearse.tokenizers import build_llama32_tokenizer

QWEN_EOS = 151645  # <|im_end|>
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


def scripted_answer(tokenizer) -> tuple[list[int], dict, list[int], list[int]]:
    """A prompt ending on the chat template's generation prompt, and the chain that answers it
    "The capital is Paris." (p = 0.7) or "Lyon, I think!" (p = 0.3), then eos. The chain is
    first-order: no token repeats within or across the answers (a repeated one would merge its
    successors)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Where?"}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    eos = [tokenizer.eos_token_id]
    paris = tokenizer.encode("The capital is Paris.", add_special_tokens=False) + eos
    lyon = tokenizer.encode("Lyon, I think!", add_special_tokens=False) + eos
    assert len(set(paris[:-1] + lyon[:-1] + prompt_ids[-1:])) == len(paris) + len(lyon) - 1
    chain = chain_from_paths([([prompt_ids[-1], *paris], 0.7), ([prompt_ids[-1], *lyon], 0.3)])
    return prompt_ids, chain, paris, lyon


@pytest.fixture(scope="module")
def qwen_standin(qwen3_tokenizer, tmp_path_factory):
    prompt, chain, paris, lyon = scripted_answer(qwen3_tokenizer)
    out = build_standin(
        "Qwen/Qwen3-4B",
        tmp_path_factory.mktemp("standin") / "qwen3-4b",
        chain,
        tokenizer=qwen3_tokenizer,
        seed=3,
    )
    return out, prompt, chain, paris, lyon


def next_token_probs(model, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return (logits / temperature).softmax(-1)


def test_chain_from_paths_by_hand():
    chain = chain_from_paths([([1, 2, 3], 1.0), ([1, 2, 4], 3.0), ([5, 1], 2.0)])
    assert chain == {1: {2: 1.0}, 2: {3: 0.25, 4: 0.75}, 5: {1: 1.0}}
    loop = chain_from_paths([([7, 8, 7, 9], 1.0)])  # 7 is revisited: its successors merge
    assert loop == {7: {8: 0.5, 9: 0.5}, 8: {7: 1.0}}
    assert successors(chain, 0, 2) == {3: 0.25, 4: 0.75}
    assert successors(chain, 0, 99) == {0: 1.0}


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        ([([1, 2], 0.0)], "path 0: weight must be positive"),
        ([([1, 2], 1.0), ([3], 1.0)], "path 1: needs at least 2 tokens"),
        ([([1, -2], 1.0)], "non-negative ints"),
        ([[1, 2, 3]], r"path 0: expected \(token ids, weight\)"),
    ],
)
def test_chain_from_paths_errors(paths, message):
    with pytest.raises(ValueError, match=message):
        chain_from_paths(paths)


def test_qwen_standin_loads_with_the_real_class_vocab_and_tokenizer(qwen_standin, qwen3_tokenizer):
    out, prompt, chain, _, _ = qwen_standin
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model) is Qwen3ForCausalLM
    assert model.config.vocab_size == 151_936 and model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.encode("<|im_start|>Paris</think>") == qwen3_tokenizer.encode(
        "<|im_start|>Paris</think>"
    )
    assert tok.chat_template == qwen3_tokenizer.chat_template
    record = json.loads((out / "standin.json").read_text())
    assert record["stands_for"] == "Qwen/Qwen3-4B"
    assert record["architecture"] == "Qwen3ForCausalLM"
    assert (record["num_hidden_layers"], record["hidden_size"], record["vocab_size"]) == (
        2,
        64,
        151_936,
    )
    assert record["tie_word_embeddings"] is True and record["real_tie_word_embeddings"] is True
    assert record["chain_rows"] == len(chain) and record["seed"] == 3
    assert record["default"] == QWEN_EOS and record["scripted"] is True
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_next_token_distribution_is_the_chain(qwen_standin, dtype):
    out, prompt, chain, paris, lyon = qwen_standin
    model = AutoModelForCausalLM.from_pretrained(out, dtype=dtype)
    ids = prompt + paris
    tolerance = 0.005 if dtype == torch.float32 else 0.03  # bf16 rounds logits near 18 to ~0.06
    for temperature in (1.0, 0.7):
        probs = next_token_probs(model, ids, temperature)
        for pos, token in enumerate(ids):
            want = successors(chain, QWEN_EOS, token)
            got = {s: probs[pos, s].item() for s in want}
            assert 1 - sum(got.values()) < 1e-4, (pos, token, temperature)  # the leak
            if temperature == 1.0:
                for s, p in want.items():
                    assert abs(got[s] - p) < tolerance, (pos, token, s, got[s], p)
    # the branch point itself, the prompt's last token: "The" 0.7, "Lyon"'s first token 0.3
    branch = successors(chain, QWEN_EOS, prompt[-1])
    assert branch == pytest.approx({paris[0]: 0.7, lyon[0]: 0.3})
    # hand-computed logits: MARGIN + log p at the successors, UNSCRIPTED_LOGIT at the others
    if dtype == torch.float32:
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        for s, p in branch.items():
            assert logits[s].item() == pytest.approx(MARGIN + math.log(p), abs=0.02)
        assert logits[12345].item() == pytest.approx(UNSCRIPTED_LOGIT, abs=0.02)


def test_hf_sampling_follows_the_chain(qwen_standin):
    out, prompt, chain, paris, lyon = qwen_standin
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.manual_seed(0)
    n = 400
    with torch.no_grad():
        gen = model.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=n,
            max_new_tokens=len(paris) + 1,
        )
    completions = [row[len(prompt) :].tolist() for row in gen]
    stripped = [c[: c.index(QWEN_EOS) + 1] if QWEN_EOS in c else c for c in completions]
    counts = Counter(tuple(c) for c in stripped)
    assert set(counts) == {tuple(paris), tuple(lyon)}  # nothing off the script
    sigma = math.sqrt(n * 0.7 * 0.3)
    assert abs(counts[tuple(paris)] - 0.7 * n) < 4 * sigma


def test_lora_on_q_and_v_gets_non_zero_gradients(qwen_standin):
    out, prompt, _, paris, _ = qwen_standin
    model = build_lora_model(
        AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32), {"policy": LORA}
    )
    ids = torch.tensor([prompt + paris])
    logits = model(ids).logits[0, :-1]
    loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    loss.backward()
    grads = {
        name: param.grad.abs().max().item()
        for name, param in model.named_parameters()
        if "lora_B" in name
    }
    assert len(grads) == 4  # q_proj and v_proj of both layers
    assert all(g > 0 for g in grads.values()), grads


def test_llama_standin_is_llama_and_follows_the_chain(tmp_path):
    tokenizer = build_llama32_tokenizer()
    prompt, chain, paris, lyon = scripted_answer(tokenizer)
    only_paris = chain_from_paths([([prompt[-1], *paris], 1.0)])
    out = build_standin(
        "meta-llama/Llama-3.2-3B-Instruct", tmp_path / "llama", only_paris, tokenizer=tokenizer
    )
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model) is LlamaForCausalLM
    assert model.config.vocab_size == 128_256 and model.config.tie_word_embeddings
    assert model.config.rope_parameters["rope_type"] == "llama3"
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.pad_token is None and tok.eos_token_id == 128009
    assert tok.encode("Hi") == [128000, 13347]
    with torch.no_grad():
        gen = model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=len(paris) + 2,
            pad_token_id=128009,
        )
    assert gen[0, len(prompt) :].tolist() == paris  # eos (128009) ends it
    record = json.loads((out / "standin.json").read_text())
    assert record["architecture"] == "LlamaForCausalLM" and record["default"] == 128009


def test_untied_real_model_gets_an_untied_standin(qwen3_tokenizer, tmp_path):
    base = qwen3_tokenizer  # eos aside, Qwen3-8B-Base's tokenizer is the same vocabulary
    out = build_standin(
        "Qwen/Qwen3-8B-Base", tmp_path / "8b", {5: {6: 1.0}}, default=7, tokenizer=base
    )
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.config.tie_word_embeddings is False
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    probs = next_token_probs(model, [100, 5, 6])
    assert probs[0, 7].item() > 0.999 and probs[1, 6].item() > 0.999 and probs[2, 7].item() > 0.999
    record = json.loads((out / "standin.json").read_text())
    assert record["tie_word_embeddings"] is False and record["real_tie_word_embeddings"] is False
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 151643


def test_unscripted_standin_is_plain_random(qwen3_tokenizer, tmp_path):
    out = build_standin("Qwen/Qwen3-0.6B", tmp_path / "random", tokenizer=qwen3_tokenizer)
    record = json.loads((out / "standin.json").read_text())
    assert record["scripted"] is False and record["default"] is None
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert next_token_probs(model, [1, 2, 3]).max().item() < 0.01  # no token is favoured


def test_errors_name_the_token_and_the_model(qwen3_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"token 200000 is outside the vocabulary \(0..151935\)"):
        build_standin(
            "Qwen/Qwen3-4B", tmp_path / "a", {1: {200000: 1.0}}, tokenizer=qwen3_tokenizer
        )
    with pytest.raises(ValueError, match="successors of token 1 must be positive and sum to 1"):
        build_standin("Qwen/Qwen3-4B", tmp_path / "b", {1: {2: 0.5}}, tokenizer=qwen3_tokenizer)
    with pytest.raises(ValueError, match="no stand-in for model 'Qwen/Qwen2.5-7B'"):
        build_standin("Qwen/Qwen2.5-7B", tmp_path / "c", tokenizer=qwen3_tokenizer)


@pytest.mark.slow
def test_vllm_generates_the_script(qwen_standin):
    from common.rollout import SamplingConfig
    from common.rollout.vllm_engine import VLLMEngine

    out, prompt, chain, paris, lyon = qwen_standin
    engine = VLLMEngine(out, max_model_len=256, kv_cache_bytes=32 * 2**20)
    sampled = engine.generate([prompt], SamplingConfig(n=64, temperature=1.0, max_tokens=12))[0]
    seen = Counter(tuple(c.token_ids) for c in sampled)
    assert set(seen) == {tuple(paris), tuple(lyon)}
    assert 0.4 < seen[tuple(paris)] / 64 < 0.95
    for c in sampled:  # each sampled token's logprob is the chain's log p
        for prev, token, logprob in zip(
            [prompt[-1], *c.token_ids[:-1]], c.token_ids, c.logprobs, strict=True
        ):
            assert logprob == pytest.approx(math.log(chain[prev][token]), abs=0.02)
