from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cer.rewards.answer import (
    BOX_OPEN,
    continuation_ids,
    emission_groups,
    find_last_box,
    last_boxed,
    solution_split,
    split_answer,
)
from common.tinyworld.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def byte_tokenizer():
    """Byte-level BPE (the tiny world's): multi-byte characters span several tokens."""
    corpus = ["so the answer is \\boxed{12} and {1} café ’ naïve 😀 \\frac{1}{2}"] * 20
    return build_tokenizer(corpus, vocab_size=400)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{12}.", "12"),
        ("\\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("first \\boxed{3}, then \\boxed{4}", "4"),
        ("\\fbox{7}", "7"),
        ("\\boxed {3}", "3"),
        ("$\\boxed 5$", "5"),
        ("\\boxed 5 apples", "5"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{a \\\\}", "a \\\\"),
        ("\\boxed{}", ""),
        ("no box here", None),
        ("\\boxed{3} and then \\boxed{4", None),  # the last box is cut off: no answer
        ("\\boxedx{1}", None),
        ("\\boxed", None),
        ("\\boxed $", None),
    ],
)
def test_last_boxed(text, answer):
    assert last_boxed(text) == answer


def test_find_last_box_spans():
    text = "x \\boxed{ab}."
    span = find_last_box(text)
    assert (span.answer_start, span.answer_end, span.closing_end) == (9, 11, 12)
    span = find_last_box("\\boxed 5")  # space form at the end: no closing character
    assert (span.answer_start, span.answer_end, span.closing_end) == (7, 8, 8)


def test_split_with_a_token_straddling_the_brace(char_tokenizer):
    tok = char_tokenizer
    ids = tok.encode("so the answer is \\boxed{12}.<|im_end|>", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[-5:] == [" \\boxed", "{1", "2}", ".", "<|im_end|>"]
    split = split_answer(ids, tok)
    # "{1" holds both the brace and the answer's first digit: the solution stops before it
    assert split.solution_ids == ids[:-4]
    assert tok.decode(split.solution_ids) == "so the answer is \\boxed"
    assert (split.tail, split.answer, split.closing) == ("{", "12", "}")
    assert split.answer_ids == ids[-4:-2]  # "{1", "2}"
    assert split.closing_ids == ids[-3:-2]  # "2}"
    assert continuation_ids(split, "1", tok) == tok.encode("{1}", add_special_tokens=False)


def test_split_space_form(char_tokenizer):
    tok = char_tokenizer
    ids = tok.encode("\\boxed 7$", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == ["\\boxed", " 7", "$"]
    split = split_answer(ids, tok)
    assert split.solution_ids == ids[:1]
    assert (split.tail, split.answer, split.closing) == (" ", "7", "$")
    assert split.continuation_text("12") == " 12$"


def test_no_box(char_tokenizer):
    tok = char_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode("the answer is 12.", add_special_tokens=False) + [eos, eos]
    assert split_answer(ids, tok) is None
    split = solution_split(ids, tok)
    # the whole visible response is the solution; the end-of-turn tokens are not
    assert split.solution_ids == ids[:-2]
    assert (split.answer, split.tail, split.closing) == (None, BOX_OPEN, "}")
    assert split.continuation_text("12") == "\\boxed{12}"
    cut_off = tok.encode("so \\boxed{12", add_special_tokens=False)
    assert split_answer(cut_off, tok) is None


def test_multibyte_characters_share_one_group(byte_tokenizer):
    tok = byte_tokenizer
    ids = tok.encode("é", add_special_tokens=False)
    assert len(ids) == 2  # two byte tokens, one character
    text, groups = emission_groups(ids, tok)
    assert text == "é"
    assert groups == [(0, 2, 0, 1)]


_PLAIN = st.text(alphabet="ab 12.,+=é’😀\n", max_size=20)


@settings(max_examples=150)
@given(
    pre=_PLAIN,
    answer=st.text(alphabet="a1 2.é’😀/-", max_size=6),
    post=st.text(alphabet="ab 12.$é’😀{}", max_size=8),
    opener=st.sampled_from(["\\boxed{", "\\fbox{", "\\boxed {"]),
)
def test_split_reconstructs_the_response(byte_tokenizer, pre, answer, post, opener):
    tok = byte_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok.encode(pre + opener + answer + "}" + post, add_special_tokens=False) + [eos]
    split = split_answer(ids, tok)
    assert split.answer == (answer if answer.strip() else None)  # an empty box is no answer
    assert split.closing == "}"
    assert split.solution_ids == ids[: len(split.solution_ids)]
    # solution + tail is exactly the text before the answer: nothing lost, nothing doubled
    assert tok.decode(split.solution_ids) + split.tail == pre + opener
    assert answer in tok.decode(split.answer_ids)
    assert "}" in tok.decode(split.closing_ids)
    assert eos not in split.solution_ids
