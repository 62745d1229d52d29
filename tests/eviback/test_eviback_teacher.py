"""The verdict contract, the six merge rules, and the gated two-stage teacher."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.llm_client import LLMClient
from common.retrieval.base import Doc
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round
from eviback.teacher import (
    TeacherItem,
    TeacherPolicy,
    TwoStageTeacher,
    Verdict,
    format_verdict,
    merge_verdicts,
    parse_verdict,
)

S_TEXT = "<reason>r</reason><status>supported_answer</status><answer>Tamsford</answer>"
I_TEXT = "<reason>r</reason><status>insufficient_evidence</status><answer></answer>"
A_TEXT = "<reason>r</reason><status>ambiguous_evidence</status><answer></answer>"

# --- parse_verdict ---------------------------------------------------------------------------


def test_parses_the_three_statuses():
    assert parse_verdict(S_TEXT) == Verdict(True, "S", "Tamsford", "r")
    assert parse_verdict(I_TEXT) == Verdict(True, "I", "", "r")
    assert parse_verdict(A_TEXT) == Verdict(True, "A", "", "r")


def test_whitespace_around_and_between_elements_is_allowed():
    text = "\n  <reason> two\nlines </reason>\n<status> supported_answer </status>\n<answer> Tamsford </answer>\n"
    assert parse_verdict(text) == Verdict(True, "S", "Tamsford", "two\nlines")
    assert parse_verdict(I_TEXT.replace("<answer></answer>", "<answer>  \n</answer>")).valid


@pytest.mark.parametrize(
    "text",
    [
        "Sure! " + S_TEXT,  # extra text before
        S_TEXT + " Hope this helps.",  # extra text after
        "<think>hm</think>" + S_TEXT,  # a reasoning model's preamble
        S_TEXT.replace("<reason>r</reason>", ""),  # missing reason
        S_TEXT.replace("<answer>Tamsford</answer>", ""),  # missing answer
        "<reason>r</reason><answer>x</answer>",  # missing status
        S_TEXT.replace("</status>", ""),  # unclosed tag
        S_TEXT + "<answer>Zuro</answer>",  # repeated answer
        S_TEXT.replace("<reason>r</reason>", "<reason>r</reason><reason>s</reason>"),  # repeated
        "<reason>a <status>x</status></reason>" + S_TEXT[len("<reason>r</reason>") :],  # nested
        "<status>supported_answer</status><reason>r</reason><answer>x</answer>",  # out of order
        S_TEXT.replace("supported_answer", "supported"),  # unknown status
        S_TEXT.replace("supported_answer", "Supported_Answer"),  # status is case-sensitive
        S_TEXT.replace("supported_answer", "S"),  # the code is not the status string
        S_TEXT.replace("Tamsford", ""),  # S with an empty answer
        S_TEXT.replace("Tamsford", "   "),  # S with a blank answer
        I_TEXT.replace("<answer></answer>", "<answer>Tamsford</answer>"),  # I with an answer
        A_TEXT.replace("<answer></answer>", "<answer>Tamsford or Zuro</answer>"),  # A with one
        S_TEXT.upper(),  # tags are lowercase
        "",
        "   ",
    ],
)
def test_malformed_forms_are_invalid(text):
    v = parse_verdict(text)
    assert not v.valid and v.status is None and v.answer == "" and v.error.startswith("parse:")


def test_non_text_is_invalid():
    assert not parse_verdict(None).valid
    assert not parse_verdict(b"bytes").valid  # type: ignore[arg-type]


FRAGMENTS = [
    "<reason>", "</reason>", "<status>", "</status>", "<answer>", "</answer>",
    "supported_answer", "insufficient_evidence", "ambiguous_evidence", "x", " ", "\n", "<", ">",
]  # fmt: skip


@given(st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)))
def test_fuzzed_text_never_raises_and_valid_means_contract(text):
    v = parse_verdict(text)
    assert isinstance(v, Verdict)
    if v.valid:
        assert v.status in ("S", "I", "A")
        assert bool(v.answer) == (v.status == "S")
        assert parse_verdict(format_verdict(v)) == v
    else:
        assert v.status is None and v.error


SAFE = st.text(st.characters(blacklist_characters="<>"), max_size=20).map(str.strip)


@given(st.sampled_from("SIA"), SAFE, SAFE)
def test_format_then_parse_round_trips(status, reason, answer):
    answer = (answer or "x") if status == "S" else ""
    v = Verdict(True, status, answer, reason)
    assert parse_verdict(format_verdict(v)) == v


def test_format_refuses_invalid():
    with pytest.raises(ValueError):
        format_verdict(Verdict(False, None, error="parse: x"))


# --- merge_verdicts: one test per rule -------------------------------------------------------

REFS = ["Ora Velk"]
EVIDENCE = "Lanterns\nLanterns is a film directed by Ora Velk."
INVALID = Verdict(False, None, error="parse: x")
S = Verdict(True, "S", "Ora Velk", "a")
I = Verdict(True, "I", "", "i")  # noqa: E741
A = Verdict(True, "A", "", "amb")


def test_rule1_invalid_stage_a_wins():
    assert merge_verdicts(INVALID, S, REFS, EVIDENCE) == INVALID


def test_rule2_stage_a_insufficient_wins():
    assert merge_verdicts(I, S, REFS, EVIDENCE) == I


@pytest.mark.parametrize("b", [None, INVALID, I])
@pytest.mark.parametrize("a", [S, A])
def test_rule3_missing_invalid_or_insufficient_b_keeps_a(a, b):
    assert merge_verdicts(a, b, REFS, EVIDENCE) == a


def test_rule4_a_supported_b_ambiguous_keeps_a():
    assert merge_verdicts(S, A, REFS, EVIDENCE) == S


def test_rule5_otherwise_b_and_the_better_answer_when_both_support():
    b = Verdict(True, "S", "Ora Velk", "b")
    assert merge_verdicts(A, b, REFS, EVIDENCE) == b  # A ambiguous, B supported
    a_ambiguous_b = Verdict(True, "A", "", "b")
    assert merge_verdicts(A, a_ambiguous_b, REFS, EVIDENCE) == a_ambiguous_b
    a_good, b_bad = Verdict(True, "S", "Ora Velk", "a"), Verdict(True, "S", "Zuro", "b")
    assert merge_verdicts(a_good, b_bad, REFS, "no refs here") == a_good
    a_bad, b_good = Verdict(True, "S", "Velk", "a"), Verdict(True, "S", "Ora Velk", "b")
    assert merge_verdicts(a_bad, b_good, REFS, "no refs here") == b_good
    a_tie, b_tie = Verdict(True, "S", "Zuro", "a"), Verdict(True, "S", "Tamsford", "b")
    assert merge_verdicts(a_tie, b_tie, REFS, "no refs here") == b_tie  # F1 0 = 0: B


def test_rule6_literal_reference_in_evidence_replaces_a_weaker_answer():
    partial = Verdict(True, "S", "Velk", "why")
    assert merge_verdicts(partial, None, REFS, EVIDENCE) == Verdict(True, "S", "Ora Velk", "why")
    # only references found in the evidence, and among them the best
    refs = ["Tamsford", "Ora Velk"]
    assert merge_verdicts(partial, None, refs, EVIDENCE).answer == "Ora Velk"
    # normalised match: case, punctuation, articles
    assert merge_verdicts(partial, None, ["The ORA velk!"], EVIDENCE).answer == "The ORA velk!"


def test_rule6_does_not_apply_when_not_literal_not_better_not_s_or_off():
    partial = Verdict(True, "S", "Velk", "why")
    assert merge_verdicts(partial, None, REFS, "Lanterns by Ora Velkson.") == partial  # not a token
    exact = Verdict(True, "S", "ora velk.", "why")  # F1 already 1: keeps its own string
    assert merge_verdicts(exact, None, REFS, EVIDENCE) == exact
    assert merge_verdicts(A, None, REFS, EVIDENCE) == A
    assert merge_verdicts(partial, None, REFS, EVIDENCE, canonicalize=False) == partial


VERDICTS = st.one_of(
    st.just(INVALID),
    st.builds(lambda r: Verdict(True, "I", "", r), SAFE),
    st.builds(lambda r: Verdict(True, "A", "", r), SAFE),
    st.builds(lambda a: Verdict(True, "S", a, "r"), st.sampled_from(["Ora Velk", "Velk", "Zuro"])),
)


@given(VERDICTS, st.one_of(st.none(), VERDICTS), st.booleans())
def test_merge_never_crosses_the_insufficiency_boundary(a, b, canonicalize):
    final = merge_verdicts(a, b, REFS, EVIDENCE, canonicalize)
    assert final.valid == a.valid
    assert (final.status == "I") == (a.status == "I")
    if final.status == "S":
        assert final.answer and (a.status == "S" or (b is not None and b.status == "S"))


# --- the two-stage teacher -------------------------------------------------------------------

ROUNDS_OK = [Round("Ora Velk", [Doc("p1", "Ora Velk", "Ora Velk was born in Tamsford.", 1.0)])]
ROUNDS_NONE = [Round("Ora Velk", [Doc("x", "Zuro", "Zuro is a city.", 1.0)])]


class ScriptedModel:
    """A rule-following teacher model: Stage A answers by the documents alone, Stage B checks
    the candidate; a question containing 'garbage' or 'down' makes it misbehave or fail."""

    def __init__(self):
        self.batches: list[list[str]] = []

    def __call__(self, batch):
        self.batches.append([m[-1]["content"] for m in batch])
        return [self._answer(m[-1]["content"]) for m in batch]

    def _answer(self, prompt):
        meta = {"prompt_tokens": 10, "completion_tokens": 4, "latency_s": 0.5, "cached": False}
        question = prompt.split("Question: ")[-1].split("\n")[0]
        if "down" in question:
            return None, {**meta, "error": "connection error", "completion_tokens": 0}
        if "garbage" in question:
            return "I think it is Tamsford.", meta
        if "ambiguous" in question:
            return A_TEXT, meta
        if "Tamsford" not in prompt.split("Documents:")[-1]:
            return I_TEXT, meta
        stage_b = "Candidate answer" in prompt
        answer = "Tamsford" if stage_b else "Tamsford city"
        return S_TEXT.replace("Tamsford", answer), meta


def item(question, rounds=ROUNDS_OK):
    return TeacherItem(question, rounds, ["Tamsford"])


def test_two_stage_runs_b_only_where_a_says_s_or_a_and_counts():
    model = ScriptedModel()
    policy = TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id, canonicalize=False)
    teacher = TwoStageTeacher(model, policy)
    items = [
        item("Where was Ora Velk born?"),  # A: S "Tamsford city"; B: S "Tamsford" (better F1)
        item("Where was Ora Velk born?", ROUNDS_NONE),  # A: I, no B
        item("ambiguous one"),  # A: A; B: A
        item("garbage"),  # A invalid, no B
        item("down"),  # client failure
    ]
    judgements, stats = teacher.judge(items)
    assert [j.final.status for j in judgements] == ["S", "I", "A", None, None]
    assert judgements[0].final.answer == "Tamsford"
    assert judgements[0].stage_a.answer == "Tamsford city"
    assert [j.stage_b is not None for j in judgements] == [True, False, True, False, False]
    assert len(model.batches) == 2 and len(model.batches[1]) == 2
    assert all("Candidate answer" in p for p in model.batches[1])
    assert judgements[4].final.error == "client: connection error"
    assert (stats.items, stats.calls_a, stats.calls_b, stats.calls) == (5, 5, 2, 7)
    assert (stats.invalid_a, stats.invalid_b, stats.failures) == (2, 0, 1)
    assert (stats.prompt_tokens, stats.completion_tokens) == (70, 24)
    assert stats.latency_s == pytest.approx(3.5)
    assert (stats.supported, stats.insufficient, stats.ambiguous, stats.invalid) == (1, 1, 1, 2)
    teacher.judge(items[:1])
    assert teacher.totals.items == 6 and teacher.totals.calls == 9


def test_gate_on_s_only_skips_b_for_ambiguous():
    model = ScriptedModel()
    policy = TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id, gate=("S",))
    judgements, stats = TwoStageTeacher(model, policy).judge([item("ambiguous one")])
    assert judgements[0].stage_b is None and stats.calls_b == 0


def test_single_stage_policy_canonicalises_against_evidence():
    policy = TeacherPolicy(STAGE_A_DEFAULT.id)
    judgements, stats = TwoStageTeacher(ScriptedModel(), policy).judge([item("Where?")])
    # A says "Tamsford city" (F1 2/3); "Tamsford" is literally in the evidence: rule 6.
    assert judgements[0].final.answer == "Tamsford" and stats.calls_b == 0


def test_items_need_references_and_backend_must_answer_each():
    teacher = TwoStageTeacher(ScriptedModel(), TeacherPolicy(STAGE_A_DEFAULT.id))
    with pytest.raises(ValueError, match="item 0"):
        teacher.judge([TeacherItem("Q?", ROUNDS_OK, [])])
    short = TwoStageTeacher(lambda batch: [], TeacherPolicy(STAGE_A_DEFAULT.id))
    with pytest.raises(ValueError, match="0 outputs for 1"):
        short.judge([item("Q?")])


def test_policy_validation_and_strategy_id():
    with pytest.raises(ValueError, match="not a stage-A"):
        TeacherPolicy(STAGE_B_DEFAULT.id)
    with pytest.raises(ValueError, match="not a stage-B"):
        TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_A_DEFAULT.id)
    with pytest.raises(ValueError, match="gate"):
        TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id, gate=("I",))
    assert TeacherPolicy(STAGE_A_DEFAULT.id).strategy_id == f"single:{STAGE_A_DEFAULT.id}"
    gated = TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id, gate=["A", "S"])
    assert gated.gate == ("A", "S")
    assert gated.strategy_id.endswith(":gate=SA:canon=1")


def test_stopped_server_becomes_counted_invalid_verdicts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    client = LLMClient(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff=0.01, timeout=2)
    teacher = TwoStageTeacher(client, TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id))
    judgements, stats = teacher.judge([item("Q1?"), item("Q2?")])
    assert all(not j.final.valid and j.final.error.startswith("client:") for j in judgements)
    assert (stats.failures, stats.invalid_a, stats.calls_b, stats.invalid) == (2, 2, 0, 2)
    assert client.stats.failures == 2
