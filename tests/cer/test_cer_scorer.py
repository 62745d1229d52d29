from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from cer.data import MathExample
from cer.rewards.answer import (
    closing_alternatives,
    continuation_ids,
    solution_split,
    tokens_starting_with,
)
from cer.rewards.expectation import cer_from_logprobs
from cer.rewards.groups import Group, score_groups
from cer.rewards.scoring import hf_prefix_scorer, naive_scorer, score_group, shared_trunks
from cer.rollout import sample_groups
from common.rollout import HFEngine
from common.rollout.engine import SamplingConfig

ROOT = Path(__file__).resolve().parents[2]


def plain_logprobs(model, prefix: list[int], continuation: list[int]) -> list[float]:
    """log pi(continuation tokens | prefix) from one ordinary forward of prefix + continuation."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix + continuation])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return [logp[len(prefix) - 1 + t, tok].item() for t, tok in enumerate(continuation)]


@pytest.fixture(scope="module")
def pairs():
    gen = torch.Generator().manual_seed(1)
    prefixes = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 6, 23)]
    conts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 4, 9, 2, 0)]
    return [p for p in prefixes for _ in conts], [c for _ in prefixes for c in conts]


@pytest.mark.parametrize("make", [hf_prefix_scorer, naive_scorer])
def test_scorers_equal_a_plain_forward(tiny_qwen3, pairs, make):
    prefixes, conts = pairs
    got = make(tiny_qwen3, batch_size=2)(prefixes, conts)  # batch 2: several chunks per prefix
    assert [len(g) for g in got] == [len(c) for c in conts]
    for p, c, g in zip(prefixes, conts, got, strict=True):
        assert g == pytest.approx(plain_logprobs(tiny_qwen3, p, c), abs=1e-5)


def forward_shapes(model, scorer, *args) -> tuple[list[tuple[int, int]], object]:
    """The decoder's input shapes during ``scorer(*args)``, and what it returned."""
    shapes = []
    hook = model.get_decoder().register_forward_hook(
        lambda m, a, kw, out: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        got = scorer(*args)
    finally:
        hook.remove()
    return shapes, got


def test_prefix_scorer_forwards_each_prefix_once(tiny_qwen3, pairs):
    prefixes, conts = pairs
    shapes, _ = forward_shapes(tiny_qwen3, hf_prefix_scorer(tiny_qwen3, batch_size=8), *pairs)
    # The 3 distinct prefixes (1, 6 and 23 tokens) share nothing: three trunks of 0, 5 and 22
    # tokens in one left-padded forward, then on them one row per prefix: its last token and
    # its 4 non-empty continuations side by side (1 + 4 + 9 + 2 tokens).
    assert shapes == [(3, 22), (3, 1 + 16)]


def test_solutions_of_one_prompt_share_its_forward(tiny_qwen3):
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 97, (30,), generator=gen).tolist()
    solutions = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (5, 1, 12, 7)]
    solutions[3][:2] = solutions[2][:2]  # two solutions also share their first two tokens
    other = torch.randint(0, 97, (9,), generator=gen).tolist()  # a second prompt's prefix
    prefixes = [prompt + s for s in solutions] + [other]
    conts = [[5, 6, 7], [8], [9, 10]]
    all_prefixes = [p for p in prefixes for _ in conts]
    all_conts = [c for _ in prefixes for c in conts]
    shapes, got = forward_shapes(
        tiny_qwen3, hf_prefix_scorer(tiny_qwen3, batch_size=16), all_prefixes, all_conts
    )
    # trunks: the prompt (30 tokens) and the other prefix less its last token (8 tokens); then
    # a row per prefix: its suffix (5, 1, 12, 7 and 1 tokens, left-padded to 12) and its
    # 3 + 1 + 2 continuation tokens
    assert shapes == [(2, 30), (5, 12 + 6)]
    for p, c, g in zip(all_prefixes, all_conts, got, strict=True):
        assert g == pytest.approx(plain_logprobs(tiny_qwen3, p, c), abs=1e-5)


def test_shared_trunks():
    a, b = list(range(10)), list(range(10, 20))
    trunks = shared_trunks([a + [1, 2], a + [3], a[:6] + [4], b, b + [5], a + [6]])
    # first three: 6 shared tokens saved twice (12) beats the first two alone (10 once); b and
    # b + [5] share 9 (a trunk stops before its shortest member's last token); then a + [6].
    assert [(t.length, t.members) for t in trunks] == [(6, [0, 1, 2]), (9, [3, 4]), (10, [5])]
    # a prompt sharing only its first 3 tokens with the one before gets its own trunk
    trunks = shared_trunks([a + [1], a + [2], a[:3] + b])
    assert [(t.length, t.members) for t in trunks] == [(10, [0, 1]), (12, [2])]
    # long solutions after a short shared prompt: the prompt is the trunk
    prompt, sols = list(range(50, 54)), [list(range(100 + 40 * i, 130 + 40 * i)) for i in range(3)]
    trunks = shared_trunks([prompt + sol for sol in sols])
    assert [(t.length, t.members) for t in trunks] == [(4, [0, 1, 2])]
    # one prompt's single solution, then a prompt of three solutions sharing only token 50
    other = [50] + list(range(200, 220))
    trunks = shared_trunks([prompt + sols[0]] + [other + sol for sol in sols])
    assert [(t.length, t.members) for t in trunks] == [(33, [0]), (21, [1, 2, 3])]
    assert shared_trunks([]) == []


def test_empty_prefix_is_an_error(tiny_qwen3):
    for make in (hf_prefix_scorer, naive_scorer):
        with pytest.raises(ValueError, match="prefix is empty"):
            make(tiny_qwen3)([[]], [[1]])


RESPONSES = [
    "We add the numbers: 5 + 7 = 12, so the answer is \\boxed{12}.",
    "Half of 2 is 1, hence \\boxed{1}.",
    "The total is 12. Final answer: \\boxed{12}",
    "The total is 3 + 4 = 7.",
]


def test_score_group(tiny_qwen3, char_tokenizer):
    tok, model = char_tokenizer, tiny_qwen3
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = tok.encode("What is 5 + 7?", add_special_tokens=False)
    splits = [
        solution_split(tok.encode(r, add_special_tokens=False) + [eos], tok) for r in RESPONSES
    ]
    calls = []

    def score_fn(prefixes, continuations, last_alternatives=None, generated=None):
        calls.append(len(prefixes))
        # "}" merged with the answer's last character ("2}"): every token starting with that
        # token's text closes the same answer (here only the token itself)
        assert last_alternatives == [
            tokens_starting_with(tok, tok.decode([c[-1]])) for c in continuations
        ]
        assert all(len(a) == 1 for a in last_alternatives)
        assert generated == [None] * len(prefixes)  # no generation cache given
        return hf_prefix_scorer(model)(prefixes, continuations, last_alternatives)

    ref_logp, answer_logp, of_sample, distinct = score_group(score_fn, prompt, splits, "12", tok)
    assert distinct == ["12", "1"]
    assert of_sample.tolist() == [0, 1, 0, -1]
    assert ref_logp.shape == (4,) and answer_logp.shape == (4, 2)
    # the reference equals answer 0 and "12" is scored once per solution: 2 pairs per solution
    assert calls == [4 * 2]
    assert torch.equal(answer_logp[:, 0], ref_logp)
    for j, split in enumerate(splits):
        prefix = prompt + split.solution_ids
        for x, value in (("12", ref_logp[j]), ("1", answer_logp[j, 1])):
            cont = tok.encode(split.tail + x + "}", add_special_tokens=False)
            assert value.item() == pytest.approx(sum(plain_logprobs(model, prefix, cont)), abs=1e-5)
    rewards = cer_from_logprobs(ref_logp, answer_logp, of_sample)
    assert rewards[0] == rewards[2] and rewards[3] == 0
    # m: only the first two solutions are scored
    ref2, ans2, of2, _ = score_group(hf_prefix_scorer(model), prompt, splits, "12", tok, m=2)
    assert torch.equal(ref2, ref_logp[:2]) and torch.equal(ans2, answer_logp[:2])
    assert torch.equal(of2, of_sample)


def test_closing_brace_rule(char_tokenizer, model_that_writes_12):
    """After a solution that goes on to write "12", the answer "1" is unlikely once its closing
    brace is scored; without it, "1" would get the probability of every answer starting with 1."""
    tok, model = char_tokenizer, model_that_writes_12
    ids = tok.encode("so the answer is \\boxed{12}.", add_special_tokens=False)
    split = solution_split(ids, tok)
    assert split.tail == "{"  # "{1" is one token here: the straddling case
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    score = hf_prefix_scorer(model)
    one, twelve, one_open = (
        math.exp(sum(lp))
        for lp in score([split.solution_ids] * 3, [enc("{1}"), enc("{12}"), enc("{1")])
    )
    assert twelve > 0.5
    assert one < 0.05
    assert one + twelve <= 1.0
    assert one_open >= twelve  # without the brace, "1" is a prefix of "12"


# ZeRO-3 ranks scoring different numbers of groups: tests/cer/test_cer_run.py's two-rank launch
# (tests/scripts/cer_two_ranks.py), one start of the ranks for it and the two-rank training.


def test_tokens_starting_with(char_tokenizer):
    tok = char_tokenizer
    got = tokens_starting_with(tok, "}")
    assert got == tuple(i for i in range(len(tok)) if tok.decode([i]).startswith("}"))
    assert tok.convert_tokens_to_ids("}") in got
    assert tokens_starting_with(tok, "<|im_end|>") == ()  # special tokens are never answers


@pytest.fixture(scope="module")
def brace_dot():
    """A tokenizer where "}" stands alone but "}." is a token too, and a random Qwen3 over it."""
    chars = sorted(set("so the answer is \\boxed{7}.$"))
    vocab = {c: i for i, c in enumerate(["<pad>", "<|im_end|>", *chars, "}.", "}$"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("}", "."), ("}", "$")]))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken("<|im_end|>", special=True)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<pad>"
    )
    torch.manual_seed(3)
    config = Qwen3Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16)  # fmt: skip
    return tok, Qwen3ForCausalLM(config).eval()


def test_a_lone_closing_brace_counts_every_token_that_starts_with_it(brace_dot):
    tok, model = brace_dot
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert tok.convert_ids_to_tokens(enc("{7}.")) == ["{", "7", "}."]
    split = solution_split(enc("so the answer is \\boxed{7}.") + [tok.eos_token_id], tok)
    assert (split.answer, split.closing) == ("7", "}")
    cont = continuation_ids(split, "7", tok)
    assert tok.convert_ids_to_tokens(cont) == ["7", "}"]
    alts = closing_alternatives(split, cont, tok)
    assert sorted(tok.convert_ids_to_tokens(list(alts))) == ["}", "}$", "}."]
    prefix = split.solution_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix + cont])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    first = logp[len(prefix) - 1, cont[0]].item()
    closing = torch.logsumexp(logp[len(prefix), list(alts)], 0).item()
    assert closing > logp[len(prefix), cont[1]].item()  # more than the lone brace
    for make in (hf_prefix_scorer, naive_scorer):
        (got,) = make(model)([prefix], [cont], [alts])
        assert got == pytest.approx([first, closing], abs=1e-5)
        (plain,) = make(model)([prefix], [cont])
        assert plain == pytest.approx(plain_logprobs(model, prefix, cont), abs=1e-5)
    # the group scorer passes them on: pi("7" | s) includes "}." and "}$"
    ref, *_ = score_group(hf_prefix_scorer(model), [], [split], "7", tok)
    assert ref.item() == pytest.approx(first + closing, abs=1e-5)
    # a continuation that does not end with the lone closing token is scored as encoded
    assert closing_alternatives(split, enc("7"), tok) is None


def test_scoring_after_the_generation_cache_equals_scoring_from_scratch(
    char_tokenizer, model_that_writes_12
):
    """HFEngine(keep_kv=True) leaves each sample's cache; the scorer then forwards only the
    answers after each solution, with the same values as forwarding prompt and solution again."""
    tok, model = char_tokenizer, model_that_writes_12
    engine = HFEngine(model, tok, keep_kv=True)
    examples = [MathExample("a", "What is 5 + 7?", "12"), MathExample("b", "Half of 2?", "1")]
    prompts = [tok.encode(ex.problem, add_special_tokens=False) for ex in examples]
    params = SamplingConfig(n=4, temperature=1.0, max_tokens=40, seed=0)
    groups = sample_groups(engine, tok, examples, prompts, params)
    usable = [
        kv.usable_for(len(s.solution_ids))
        for g in groups
        for kv, s in zip(g.kvs, g.splits, strict=True)
    ]
    assert sum(usable) >= 6  # most samples reuse their cache (a cut-off one cannot)
    scorer = hf_prefix_scorer(model, batch_size=3)
    shapes, with_kv = forward_shapes(model, score_groups, scorer, groups, tok, None)
    plain = [Group(g.example, g.prompt_ids, g.trajs, g.splits) for g in groups]  # no kvs
    without = score_groups(scorer, plain, tok, None)
    for a, b in zip(with_kv, without, strict=True):
        assert torch.allclose(a[0], b[0], atol=1e-5) and torch.allclose(a[1], b[1], atol=1e-5)
        assert torch.equal(a[2], b[2]) and a[3] == b[3]
    # the reused rows went through the model as their answers only: no prompt-wide forward
    # beyond those of the samples that could not reuse theirs
    plain_shapes, _ = forward_shapes(model, score_groups, scorer, plain, tok, None)
    assert sum(b * w for b, w in shapes) < sum(b * w for b, w in plain_shapes)
