import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.metrics import cover_exact_match, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("The  Cat, sat!", "cat sat"),
        ("An apple a day", "apple day"),
        ("Theatre anthem", "theatre anthem"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("  \tNew\nYork  ", "new york"),
        ("a-b", "ab"),
        ("the", ""),
        ("Zoë’s café", "zoë’s café"),  # only ASCII punctuation, as in SQuAD
    ],
)
def test_normalize_answer(raw: str, normalised: str) -> None:
    assert normalize_answer(raw) == normalised


def test_f1_hand_computed() -> None:
    # prediction {cat, sat} vs gold {cat, sat, on, mat}: P = 2/2, R = 2/4
    assert f1_score("the cat sat", ["cat sat on mat"]) == pytest.approx(
        2 * (2 / 2 * 2 / 4) / (2 / 2 + 2 / 4)
    )
    # tokens count as a multiset: pred [x, x, y] and gold [x, z] share one x
    assert f1_score("x x y", "x z") == pytest.approx(2 * (1 / 3 * 1 / 2) / (1 / 3 + 1 / 2))
    assert f1_score("Paris", "London") == 0.0


def test_f1_max_over_golds_and_str_gold() -> None:
    assert f1_score("barack obama", ["obama", "Barack Obama"]) == 1.0
    assert f1_score("barack obama", ["obama", "michelle"]) == pytest.approx(2 / 3)
    assert f1_score("barack obama", "obama") == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("pred", "gold", "f1"),
    [
        ("yes", "yes", 1.0),
        ("Yes.", "yes", 1.0),
        ("yes", "yes it is", 0.0),
        ("no idea", "no", 0.0),
        ("noanswer", "no answer", 0.0),
        (
            "no answer",
            "no answer",
            1.0,
        ),  # "no answer" normalises to two tokens, not the special one
    ],
)
def test_f1_yes_no_noanswer_must_match_exactly(pred: str, gold: str, f1: float) -> None:
    assert f1_score(pred, [gold]) == f1


def test_exact_match() -> None:
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel", ["eiffel tower"]) == 0.0
    assert exact_match("1755", ["1754", "1755"]) == 1.0


def test_cover_exact_match_on_token_boundaries() -> None:
    assert cover_exact_match("It was founded in 1755 by Lomonosov.", ["1755"]) == 1.0
    assert cover_exact_match("the city of Paris, France", "paris") == 1.0
    assert cover_exact_match("a Parisian cafe", ["paris"]) == 0.0
    assert cover_exact_match("New York City", ["new york", "boston"]) == 1.0
    assert cover_exact_match("York", ["new york"]) == 0.0
    assert cover_exact_match("anything", ["the"]) == 0.0  # empty gold covers nothing


@pytest.mark.parametrize("metric", [exact_match, f1_score, cover_exact_match])
@pytest.mark.parametrize("pred", [None, "", "   ", "the", "?!"])
def test_empty_prediction_scores_zero(metric, pred: str | None) -> None:
    assert metric(pred, ["the", "x"]) == 0.0


@pytest.mark.parametrize("metric", [exact_match, f1_score, cover_exact_match])
def test_no_golds_is_an_error(metric) -> None:
    with pytest.raises(ValueError, match="no gold answers"):
        metric("x", [])


# small alphabets and the special words, so that matches and partial overlaps are common
pieces = st.sampled_from([*"abc xyz.,-'", "the", " an ", " yes", "no ", "noanswer"])
answers = st.lists(pieces, max_size=12).map("".join)


@given(pred=st.one_of(st.none(), answers), golds=st.lists(answers, min_size=1, max_size=3))
def test_score_properties(pred: str | None, golds: list[str]) -> None:
    em, f1, cem = exact_match(pred, golds), f1_score(pred, golds), cover_exact_match(pred, golds)
    assert all(0.0 <= s <= 1.0 for s in (em, f1, cem))
    assert em in (0.0, 1.0) and cem in (0.0, 1.0)
    assert em <= f1 and em <= cem
    assert f1_score(pred, golds) == max(f1_score(pred, [g]) for g in golds)


@given(answers)
def test_answer_matches_itself(x: str) -> None:
    expected = 1.0 if normalize_answer(x) else 0.0
    assert exact_match(x, [x]) == f1_score(x, [x]) == cover_exact_match(x, x) == expected
    assert normalize_answer(normalize_answer(x)) == normalize_answer(x)
