from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cer.rewards.verifiers import (
    exact_verifier,
    extract_letter,
    letter_verifier,
    normalize_answer,
    rule_verifier,
)

HALF = ["1/2", "0.5", "\\frac{1}{2}", "\\dfrac{1}{2}", "$\\frac12$", ".5"]


@pytest.mark.parametrize("answer", HALF)
@pytest.mark.parametrize("gold", ["1/2", "0.5", "\\frac{1}{2}"])
def test_rule_accepts_equivalent_forms(answer, gold):
    assert rule_verifier(answer, gold)


@pytest.mark.parametrize(
    ("answer", "gold"),
    [("0.51", "1/2"), ("2", "1/2"), ("", "1/2"), ("1/2", ""), ("\\frac{1}{3}", "0.33")],
)
def test_rule_rejects(answer, gold):
    assert not rule_verifier(answer, gold)


def test_rule_in_a_worker_thread():
    """math-verify's time limit needs the main thread; elsewhere the verifier still works."""
    results = []
    worker = threading.Thread(target=lambda: results.append(rule_verifier("0.5", "\\frac{1}{2}")))
    worker.start()
    worker.join()
    assert results == [True]


@pytest.mark.parametrize(
    ("answer", "gold", "same"),
    [
        ("0.5", "\\frac{1}{2}", False),
        ("1/2", "0.5", False),
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}", True),
        (" \\frac {1} {2}. ", "\\frac{1}{2}", True),
        ("\\text{Paris}", "Paris", True),
        ("\\left(1, 2\\right)", "(1,2)", True),
        ("paris", "Paris", False),
    ],
)
def test_exact(answer, gold, same):
    assert exact_verifier(answer, gold) is same


def test_normalize_answer():
    assert normalize_answer("$ \\dfrac{3}{4}\\, $") == "\\frac{3}{4}"


@pytest.mark.parametrize(
    ("answer", "letter"),
    [
        ("B", "B"),
        ("(B)", "B"),
        ("B.", "B"),
        ("B. 42 apples", "B"),
        ("C)", "C"),
        ("J: none", "J"),
        ("\\text{B}", "B"),
        ("$\\textbf{(D)}$", "D"),
        (" (A) the first one", "A"),
        ("K", None),
        ("b", None),
        ("Because", None),
        ("", None),
        ("42", None),
    ],
)
def test_extract_letter(answer, letter):
    assert extract_letter(answer) == letter


def test_letter_verifier():
    assert letter_verifier("(B)", "B")
    assert letter_verifier("\\text{B}", " b ")
    assert not letter_verifier("C", "B")
    assert not letter_verifier("none", "B")


@settings(max_examples=60)
@given(st.text(max_size=30), st.text(max_size=10))
def test_garbage_never_raises(answer, gold):
    for verifier in (rule_verifier, exact_verifier, letter_verifier):
        assert isinstance(verifier(answer, gold), bool)


@pytest.mark.parametrize(
    "answer", ["\\frac{", "}{", "\\boxed{\\boxed{", "1/0", "x^^2", "\\sqrt", "$$"]
)
def test_malformed_latex_is_not_verified(answer):
    assert rule_verifier(answer, "1/2") is False
