"""CER under Qwen3's real tokenizer (tests/qwen_tokenizer.py): the closing brace merged with the
answer's last characters, the empty box, and the per-answer choice of solutions, scored with a
random tiny Qwen3 over the real vocabulary.

Token ids below were read off the converted tokenizer, which matches Qwen's own tiktoken encoder
(tests/test_qwen_tokenizer.py): ``"}}"`` 3417, ``"}}\\n"`` 11248, ``")}"`` 9139, ``")}."`` 96351,
``"}"`` 92, ``"}$"`` 31716 (the tests decode each id they name).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from cer.data import MathExample
from cer.prompt import prompt_ids
from cer.rewards.answer import closing_alternatives, continuation_ids, solution_split, split_answer
from cer.rewards.groups import Group, group_rewards
from cer.rewards.scoring import hf_prefix_scorer, naive_scorer, score_group


@pytest.fixture(scope="module")
def model(tiny_qwen3_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()


def response(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def last_token_logp(model, prefix: list[int], cont: list[int]) -> torch.Tensor:
    """log_softmax over the vocabulary at the position that predicts ``cont``'s last token."""
    ids = torch.tensor([prefix + cont])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prefix) + len(cont) - 2]
    return torch.log_softmax(logits.float(), -1)


CASES = [
    # response, answer, continuation (tail + answer + "}") ids, its last token's text, one more
    # token that closes the same answer (its sampled form or a common one)
    (
        "So the answer is \\boxed{\\frac{1}{2}}.",
        "\\frac{1}{2}",
        [35702, 37018, 90, 16, 15170, 17, 3417],
        "}}",
        11248,
    ),
    ("Thus \\boxed{(A)}.", "(A)", [96065, 32, 9139], ")}", 96351),
]


@pytest.mark.parametrize(("text", "answer", "cont", "last", "other"), CASES)
def test_merged_closing_sums_every_token_that_starts_with_it(
    qwen3_tokenizer, model, text, answer, cont, last, other
):
    tok = qwen3_tokenizer
    split = split_answer(response(tok, text), tok)
    assert split.answer == answer and split.closing == "}"
    assert continuation_ids(split, answer, tok) == cont
    assert tok.decode([cont[-1]]) == last and tok.decode([other]).startswith(last)
    alts = closing_alternatives(split, cont, tok)
    # every token whose text starts with the merged one, the lone "}" not among them
    assert alts is not None and cont[-1] in alts and other in alts
    assert 92 not in alts and all(tok.decode([i]).startswith(last) for i in alts)
    prefix = tok.encode("Q: what?", add_special_tokens=False) + split.solution_ids
    logp = last_token_logp(model, prefix, cont)
    expected_last = torch.logsumexp(logp[list(alts)], -1).item()
    assert expected_last > logp[cont[-1]].item()  # more than the one canonical token
    for scorer in (hf_prefix_scorer(model), naive_scorer(model)):
        (got,) = scorer([prefix], [cont], [alts])
        assert got[-1] == pytest.approx(expected_last, abs=1e-5)


def test_lone_closing_brace_keeps_summing_over_brace_tokens(qwen3_tokenizer):
    tok = qwen3_tokenizer
    split = split_answer(response(tok, "x $\\boxed{12}$."), tok)
    cont = continuation_ids(split, "12", tok)
    assert cont == [16, 17, 92]  # digits one at a time, "}" alone
    alts = closing_alternatives(split, cont, tok)
    assert 92 in alts and 31716 in alts and tok.decode([31716]) == "}$"


def make_group(tok, gold: str, texts: list[str]) -> Group:
    ex = MathExample("q", "What is the answer?", gold, {})
    splits = [solution_split(response(tok, t), tok) for t in texts]
    return Group(ex, prompt_ids(tok, ex), [], splits)


def test_empty_box_earns_nothing(qwen3_tokenizer, model):
    tok = qwen3_tokenizer
    g = make_group(tok, "12", ["So \\boxed{}.", "So \\boxed{ }", "So \\boxed{12}.", "no box"])
    assert [s.answer for s in g.splits] == [None, None, "12", None]
    # the empty box's solution is still cut at the box: "So", then " \boxed" ...
    assert tok.decode(g.splits[0].solution_ids) == "So \\boxed"
    rewards, _ = group_rewards(
        ["cer", "verifree", "exact", "rule"], [g], hf_prefix_scorer(model), tok
    )
    for kind in ("cer", "verifree", "exact", "rule"):
        assert rewards[kind][[0, 1, 3]].tolist() == [0.0, 0.0, 0.0], kind
    assert rewards["cer"][2] > 0 and rewards["verifree"][2] > 0


def test_per_answer_selection_with_m_below_g(qwen3_tokenizer, model):
    tok = qwen3_tokenizer
    texts = ["So \\boxed{3}.", "So \\boxed{12}.", "Then \\boxed{3}", "Hence \\boxed{12}"]
    g = make_group(tok, "12", texts)
    scorer = hf_prefix_scorer(model)
    ref, _, _, _ = score_group(scorer, g.prompt_ids, g.splits, "12", tok)  # all 4 solutions
    p_ref = ref.exp().float()
    # m = 1: R_k = pi(a* | s_j) with j the first solution that produced a_k (the release) ...
    per_answer, _ = group_rewards(["cer"], [g], scorer, tok, m=1, selection="per_answer")
    assert torch.allclose(per_answer["cer"], p_ref[[0, 1, 0, 1]], atol=1e-6)
    # ... or the group's first solution for every answer (the option)
    first, _ = group_rewards(["cer"], [g], scorer, tok, m=1, selection="first")
    assert torch.allclose(first["cer"], p_ref[[0, 0, 0, 0]], atol=1e-6)
