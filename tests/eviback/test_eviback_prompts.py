"""Teacher prompts: evidence rendering, ids, hashes, the registry and the stage contracts."""

from __future__ import annotations

import string

import pytest

from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.ape import PromptAxes, candidate_grid
from eviback.prompts import (
    PROMPTS,
    STAGE_A_DEFAULT,
    STAGE_B_DEFAULT,
    Round,
    TeacherPrompt,
    evidence_text,
    get_prompt,
    render_evidence,
    rounds_from_trajectory,
)

D1 = Doc("f1", "Lanterns", "Lanterns is a 1998 film directed by Ora Velk.", 3.0)
D2 = Doc("p1", "Ora Velk", "Ora Velk was born in Tamsford.", 2.0)
D3 = Doc("p2", "", "An untitled note {with braces}.", 1.0)
ROUNDS = [Round("Lanterns director", [D1, D3, D2]), Round("Ora Velk", [D2])]


def test_render_evidence_with_queries_and_titles():
    assert render_evidence(ROUNDS, show_queries=True, top_m=2) == (
        "Search round 1\n"
        "Query: Lanterns director\n"
        "Doc 1 (Title: Lanterns) Lanterns is a 1998 film directed by Ora Velk.\n"
        "Doc 2 An untitled note {with braces}.\n"
        "\n"
        "Search round 2\n"
        "Query: Ora Velk\n"
        "Doc 3 (Title: Ora Velk) Ora Velk was born in Tamsford."
    )


def test_render_evidence_layout_options():
    text = render_evidence(
        ROUNDS, show_queries=False, top_m=2, show_titles=False, doc_order="reverse"
    )
    assert text == (
        "Search round 1\n"
        "Doc 1 An untitled note {with braces}.\n"
        "Doc 2 Lanterns is a 1998 film directed by Ora Velk.\n"
        "\n"
        "Search round 2\n"
        "Doc 3 Ora Velk was born in Tamsford."
    )
    assert "Query:" not in text and "Title:" not in text


def test_render_evidence_edge_cases():
    assert "no search" in render_evidence([], show_queries=True, top_m=5)
    assert "(no documents returned)" in render_evidence([Round("q", [])], True, 5)
    with pytest.raises(ValueError, match="top_m"):
        render_evidence(ROUNDS, True, 0)
    with pytest.raises(ValueError, match="doc_order"):
        render_evidence(ROUNDS, True, 5, doc_order="random")


def test_evidence_text_keeps_top_m_of_each_round():
    text = evidence_text(ROUNDS, top_m=1)
    assert "Lanterns is a 1998 film" in text and "Tamsford" in text
    assert "untitled" not in text


def test_rounds_from_trajectory_takes_search_steps_in_order():
    t = Trajectory("g", 0, "q", "Q?", ["a"], [1])
    t.steps = [
        Step("search", 0, 1, query="Lanterns director", docs=[D1]),
        Step("invalid", 1, 2),
        Step("search", 2, 3, query="Ora Velk", docs=[D2]),
        Step("answer", 3, 4),
    ]
    assert rounds_from_trajectory(t) == [Round("Lanterns director", [D1]), Round("Ora Velk", [D2])]


def test_template_fields_are_exactly_the_documented_ones():
    for prompt in candidate_grid("A") + candidate_grid("B"):
        names = {f for _, f, _, _ in string.Formatter().parse(prompt.text) if f is not None}
        expected = {"question", "evidence"} | ({"references"} if prompt.stage == "B" else set())
        assert names == expected, prompt.id


def test_ids_and_hashes_are_unique_and_ids_round_trip():
    grid = candidate_grid("A") + candidate_grid("B")
    assert len({p.id for p in grid}) == len(grid) == len({p.hash for p in grid})
    for p in grid:
        assert get_prompt(p.id) == p
        assert len(p.hash) == 12 and int(p.hash, 16) >= 0
    assert get_prompt(STAGE_A_DEFAULT.id) is PROMPTS[STAGE_A_DEFAULT.id]


def test_hash_follows_layout_and_text():
    base = TeacherPrompt("A", "basic")
    assert base.hash == TeacherPrompt("A", "basic").hash
    for changed in (
        TeacherPrompt("A", "basic", show_queries=False),
        TeacherPrompt("A", "basic", top_m=3),
        TeacherPrompt("A", "basic", few_shot=True),
        TeacherPrompt("A", "strict"),
    ):
        assert changed.hash != base.hash


def test_bad_ids_and_options_are_errors():
    with pytest.raises(ValueError, match="unknown prompt id"):
        get_prompt("stage_a_v1")
    with pytest.raises(ValueError, match="not canonical"):
        get_prompt("A-basic-span-fs0-q1-t1-rank-m05")
    with pytest.raises(ValueError, match="instruction"):
        get_prompt("A-verify-span-fs0-q1-t1-rank-m5")  # a stage-B instruction
    with pytest.raises(ValueError, match="sub-queries"):
        TeacherPrompt("B", "verify", show_queries=True)
    with pytest.raises(ValueError, match="answer rule"):
        TeacherPrompt("A", "basic", answer_rule="long")


def test_stage_a_is_gold_blind_and_stage_b_sees_references_but_no_queries():
    [a] = STAGE_A_DEFAULT.messages("Where was the director of Lanterns born?", ROUNDS)
    assert a["role"] == "user"
    assert "Query: Lanterns director" in a["content"] and "{with braces}" in a["content"]
    assert "Candidate answer" not in a["content"]
    with pytest.raises(ValueError, match="gold-blind"):
        STAGE_A_DEFAULT.messages("Q?", ROUNDS, ["Tamsford"])
    [b] = STAGE_B_DEFAULT.messages("Q?", ROUNDS, ["Tamsford", "Tams Ford"])
    assert '"Tamsford" | "Tams Ford"' in b["content"] and "Query:" not in b["content"]
    with pytest.raises(ValueError, match="needs the reference"):
        STAGE_B_DEFAULT.messages("Q?", ROUNDS)


def test_grid_respects_axes():
    axes = PromptAxes(instructions_a=("basic",), few_shot=(False,), top_m=(3, 5))
    grid = candidate_grid("A", axes)
    # default first, then 1 instruction x 2 rules x 1 x 2 queries x 2 titles x 2 orders x 2 m
    assert grid[0] == STAGE_A_DEFAULT
    assert len(grid) == 1 + 2 * 2 * 2 * 2 * 2
    assert all(not p.show_queries for p in candidate_grid("B"))
    sample = candidate_grid("A", limit=5, seed=3)
    assert len(sample) == 5 and sample[0] == STAGE_A_DEFAULT
    assert sample == candidate_grid("A", limit=5, seed=3)
    assert sample != candidate_grid("A", limit=5, seed=4)
