"""The rubric prompt (prefix before / after / none), the criteria parser and the prompt's ids."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arco.rubric_prompt import (
    DEFAULT_TASK,
    PREFIX_MODES,
    format_criteria,
    parse_criteria,
    rubric_messages,
    rubric_prompt_ids,
)
from arco.steps import AgentStep

QUESTION = "Where was the director of Lanterns born?"
STEPS = [
    AgentStep("search", "Search[Lanterns film]", "Lanterns is a 1998 film by Ora Velk.", 3),
    AgentStep("search", "Search[Ora Velk]", "Ora Velk was born in Tamsford.", 2),
    AgentStep("answer", "Finish[Tamsford]", "", 1),
]
FORCED = [
    AgentStep("search", "Search[a]", "Doc a.", 3),
    AgentStep("search", "Search[b]", "Doc b.", 2),
    AgentStep("invalid", "I think so", "Your action is invalid.", 1),
    AgentStep("search", "Search[c]", "", 0, forced=True),
]


def user_text(*args, **kwargs) -> str:
    system, user = rubric_messages(*args, **kwargs)
    assert system["role"] == "system" and user["role"] == "user"
    return user["content"]


def test_system_text_is_a_rubric_writer_with_the_task():
    system, _ = rubric_messages(QUESTION, STEPS, 0, 3)
    assert "rubric" in system["content"] and DEFAULT_TASK in system["content"]
    assert "at most 3 searches" in DEFAULT_TASK and "must finish" in DEFAULT_TASK
    system, _ = rubric_messages(QUESTION, STEPS, 0, 3, task="Answer riddles.")
    assert "Answer riddles." in system["content"] and DEFAULT_TASK not in system["content"]


def test_prefix_before_holds_the_state_before_the_action():
    text = user_text(QUESTION, STEPS, 2, 3)
    assert text.startswith(f"Question: {QUESTION}\n\nTrajectory so far:\n")
    assert (
        "Trajectory so far:\n"
        "Action: Search[Lanterns film]\n"
        "Observation: Lanterns is a 1998 film by Ora Velk.\n"
        "Action: Search[Ora Velk]\n"
        "Observation: Ora Velk was born in Tamsford.\n"
        "\n"
        "Searches remaining before this action: 1\n"
        "\n"
        "Action being evaluated: Finish[Tamsford]\n"
    ) in text
    assert text.count("Action: ") == 2


def test_prefix_before_leaves_out_the_judged_step():
    text = user_text(QUESTION, STEPS, 1, 3)
    assert (
        "Action: Search[Lanterns film]\nObservation: Lanterns is a 1998 film by Ora Velk.\n\n"
        in text
    )
    assert "Ora Velk was born in Tamsford." not in text
    assert "Action: Search[Ora Velk]" not in text
    assert "Searches remaining before this action: 2\n" in text
    assert "Action being evaluated: Search[Ora Velk]\n" in text


def test_first_step_has_no_trajectory():
    text = user_text(QUESTION, STEPS, 0, 3)
    assert "Trajectory so far:\n(none)\n\nSearches remaining before this action: 3\n" in text
    assert "Observation:" not in text


def test_prefix_after_reproduces_the_release():
    text = user_text(QUESTION, STEPS, 1, 3, prefix="after")
    assert (
        "Action: Search[Lanterns film]\n"
        "Observation: Lanterns is a 1998 film by Ora Velk.\n"
        "Action: Search[Ora Velk]\n"
        "Observation: Ora Velk was born in Tamsford.\n"
        "\n"
        "Searches remaining before this action: 1\n"
    ) in text
    first = user_text(QUESTION, STEPS, 0, 3, prefix="after")
    assert "(none)" not in first and "Observation: Lanterns is a 1998 film" in first
    assert "Searches remaining before this action: 2\n" in first
    forced = user_text(QUESTION, FORCED, 3, 3, prefix="after")
    assert "Searches remaining before this action: 0\n" in forced


# a search, an invalid turn, a search, the gold answer on the forced turn (3 searches allowed)
WANDER = [
    AgentStep("search", "Search[Lanterns film]", "Lanterns is a 1998 film by Ora Velk.", 3),
    AgentStep(
        "invalid", "I am not sure.", "Invalid action. Use Search[query] or Finish[answer].", 2
    ),
    AgentStep("search", "Search[Ora Velk]", "Ora Velk was born in Tamsford.", 1),
    AgentStep("answer", "Finish[Tamsford]", "", 0, forced=True),
]


@pytest.mark.parametrize(
    ("steps", "t", "budget"),
    [
        # the release (_build_mu_text, _step_cost): 3 minus the Search actions in the history
        # after the step, the judged one included; a Finish or an invalid action costs nothing
        (WANDER, 0, 2),  # 3 - 1
        (WANDER, 1, 2),  # 3 - 1: the invalid turn costs nothing here
        (WANDER, 2, 1),  # 3 - 2
        (WANDER, 3, 1),  # 3 - 2: the forced Finish costs nothing
        (STEPS, 2, 1),  # two searches, then Finish: 3 - 2
        ([AgentStep("answer", "Finish[Tamsford]", "", 3)], 0, 3),  # Finish at once: 3 - 0
        (FORCED, 3, 0),  # a search on the forced turn is a Search action: max(3 - 4, 0)
    ],
)
def test_prefix_after_counts_the_searches_as_the_release(steps, t, budget):
    text = user_text(QUESTION, steps, t, 3, prefix="after")
    assert f"\n\nSearches remaining before this action: {budget}\n\n" in text


def test_prefix_none_has_question_and_action_only():
    text = user_text(QUESTION, STEPS, 2, 3, prefix="none")
    assert text.startswith(f"Question: {QUESTION}\n\nAction being evaluated: Finish[Tamsford]\n")
    assert "Trajectory so far" not in text and "Searches remaining" not in text
    assert "Observation:" not in text and "Search[Ora Velk]" not in text


def test_request_asks_for_k_criteria_as_json_with_rules():
    text = user_text(QUESTION, FORCED, 3, 2)
    assert "Searches remaining before this action: 0\n" in text
    assert "exactly 2 short criterion phrases" in text
    assert text.endswith('{"criteria": ["...", "..."]}')
    for aspect in ("query targeting", "planning", "evidence gathering", "answer readiness"):
        assert aspect in text
    assert "redundant searches" in text
    assert "invalid" in text and "no searches remain" in text
    assert user_text(QUESTION, FORCED, 3, 1).endswith('{"criteria": ["..."]}')


@pytest.mark.parametrize(
    ("t", "k", "prefix"), [(-1, 3, "before"), (3, 3, "before"), (0, 0, "before"), (0, 3, "pre")]
)
def test_rubric_messages_rejects_bad_arguments(t, k, prefix):
    with pytest.raises(ValueError):
        rubric_messages(QUESTION, STEPS, t, k, prefix=prefix)


def test_every_prefix_mode_builds():
    assert PREFIX_MODES == ("before", "after", "none")
    for mode in PREFIX_MODES:
        assert len(rubric_messages(QUESTION, STEPS, 1, 3, prefix=mode)) == 2


def test_format_criteria_is_json():
    assert format_criteria(["Búsqueda precisa", 'says "why"']) == (
        '{"criteria": ["Búsqueda precisa", "says \\"why\\""]}'
    )


CRITERIA = ["Targets the director", "Uses the found name", "Avoids repeating a search"]


@pytest.mark.parametrize(
    "text",
    [
        format_criteria(CRITERIA),
        '```json\n{"criteria": ["Targets the director", "Uses the found name", '
        '"Avoids repeating a search"]}\n```',
        '<think>\nMaybe {"criteria": ["x"]}.\n</think>\n\n' + format_criteria(CRITERIA),
        "Reasoning that was opened in the prompt.</think>" + format_criteria(CRITERIA),
        "Here is the rubric: " + format_criteria(CRITERIA) + " Hope it helps {}",
        '{"note": 1} {"criteria": ["  Targets the director ", "Uses the found name", '
        '"Avoids repeating a search\\n"], "extra": true}',
    ],
)
def test_parse_criteria_valid(text):
    assert parse_criteria(text, 3) == CRITERIA


@pytest.mark.parametrize(
    "text",
    [
        format_criteria(CRITERIA[:2]),
        format_criteria([*CRITERIA, "One more"]),
        format_criteria(["Targets the director", "  ", "Avoids repeating a search"]),
        format_criteria(["Targets the director", "", "Avoids repeating a search"]),
        '{"criteria": ["Targets the director", 2, "Avoids repeating a search"]}',
        '{"criteria": ["Targets the director", null, ["a"]]}',
        '{"criteria": "Targets the director, Uses the found name, Avoids repeating a search"}',
        "1. Targets the director\n2. Uses the found name\n3. Avoids repeating a search",
        format_criteria(CRITERIA)[:-3],
        "<think>\n" + format_criteria(CRITERIA),
        "<think>" + format_criteria(CRITERIA) + "</think>",
        "",
        '{"criteria": ' + "[" * 100_000,
    ],
)
def test_parse_criteria_invalid(text):
    assert parse_criteria(text, 3) is None


FRAGMENTS = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"',
        '"criteria"',
        '{"criteria": [',
        '"a"',
        '" "',
        '""',
        "1",
        "null",
        "\\",
        "<think>",
        "</think>",
        "```json\n",
        "```",
        " ",
        "\n",
    ]
)
JSONISH = st.lists(st.one_of(FRAGMENTS, st.text(max_size=4)), max_size=30).map("".join)


@settings(max_examples=300)
@given(text=st.one_of(st.text(), JSONISH), k=st.integers(1, 4))
def test_parse_criteria_never_raises(text, k):
    result = parse_criteria(text, k)
    assert result is None or (
        len(result) == k and all(isinstance(c, str) and c and c == c.strip() for c in result)
    )


# A criterion quoting a think tag would be cut by the think-block stripping: not a rubric phrase.
PHRASE = st.text(min_size=1).map(str.strip).filter(lambda s: s and "think>" not in s)


@settings(max_examples=200)
@given(criteria=st.lists(PHRASE, min_size=1, max_size=5))
def test_format_parse_round_trip(criteria):
    assert parse_criteria(format_criteria(criteria), len(criteria)) == criteria


@pytest.fixture(scope="module")
def tokenizer():
    from common.tinyworld.tokenizer import build_tokenizer

    return build_tokenizer([QUESTION, *(s.observation for s in STEPS)], vocab_size=512)


def test_rubric_prompt_ids_end_with_the_assistant_header(tokenizer):
    messages = rubric_messages(QUESTION, STEPS, 1, 3)
    ids = rubric_prompt_ids(tokenizer, messages)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    text = tokenizer.decode(ids)
    assert QUESTION in text and "Action being evaluated: Search[Ora Velk]" in text
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_rubric_prompt_ids_turn_thinking_off(tokenizer):
    # The tail of Qwen3's template: thinking off puts an empty think block after the header.
    qwen3_like = copy.deepcopy(tokenizer)
    qwen3_like.chat_template = tokenizer.chat_template.replace(
        "{{- '<|im_start|>assistant\\n' }}",
        "{{- '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking is false %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
    )
    messages = rubric_messages(QUESTION, STEPS, 0, 3)
    text = qwen3_like.decode(rubric_prompt_ids(qwen3_like, messages))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_request_in_system_moves_the_request_and_nothing_else():
    user_layout = rubric_messages(QUESTION, STEPS, 1, 3)
    system_layout = rubric_messages(QUESTION, STEPS, 1, 3, request_in="system")
    request = user_layout[1]["content"].rpartition("\n\n")[2]
    assert request.startswith("Write exactly 3 short criterion phrases")
    assert system_layout[0]["content"] == user_layout[0]["content"] + "\n\n" + request
    assert system_layout[1]["content"] + "\n\n" + request == user_layout[1]["content"]
    assert system_layout[1]["content"].endswith(f"Action being evaluated: {STEPS[1].action}")
    # every step's prompt then opens with the same system text, request included
    assert {rubric_messages(QUESTION, STEPS, t, 3, request_in="system")[0]["content"]
            for t in range(3)} == {system_layout[0]["content"]}  # fmt: skip
    # no request (rubric mode none): the two layouts are one prompt
    assert rubric_messages(QUESTION, STEPS, 1, 3, request="", request_in="system") == (
        rubric_messages(QUESTION, STEPS, 1, 3, request="")
    )
    with pytest.raises(ValueError, match="request_in"):
        rubric_messages(QUESTION, STEPS, 1, 3, request_in="assistant")
