"""ARCO's warmup teacher: the parsers, the tiny world's oracle, and the LLM path against a real
OpenAI-compatible server (FastAPI + uvicorn) on loopback playing a scripted teacher."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback_server import serve

from arco.steps import AgentStep, Episode
from arco.teacher import (
    INVALID_OBSERVATION,
    StepAnnotation,
    annotate,
    annotation_messages,
    oracle_annotation,
    oracle_outcomes,
    oracle_support,
    parse_annotation,
    parse_teacher_action,
    teacher_policy_messages,
    teacher_rollouts,
)
from common.data import QAExample
from common.llm_client import LLMClient
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory


def episode(steps: list[AgentStep], reward: float, question: str = "Q?", answer=None) -> Episode:
    return Episode("q", question, ["gold"], steps, answer, reward)


def annotation_json(rows: list[tuple[int, list, list]]) -> str:
    return json.dumps([{"step": s, "criteria": c, "scores": x} for s, c, x in rows])


# --- parse_annotation -------------------------------------------------------------------------


def test_parse_annotation_one_indexed():
    text = annotation_json([(1, ["a", "b"], [0.5, 1]), (2, ["c", "d"], [-0.25, 0])])
    parsed, reason = parse_annotation(text, n_steps=2, k=2)
    assert reason == "ok"
    assert parsed == [
        StepAnnotation(["a", "b"], [0.5, 1.0]),
        StepAnnotation(["c", "d"], [-0.25, 0.0]),
    ]


def test_parse_annotation_zero_indexed_out_of_order_is_sorted():
    text = annotation_json([(1, ["second"], [0.2]), (0, ["first"], [0.8])])
    parsed, reason = parse_annotation(text, n_steps=2, k=1)
    assert reason == "ok"
    assert [a.criteria for a in parsed] == [["first"], ["second"]]
    assert [a.scores for a in parsed] == [[0.8], [0.2]]


def test_parse_annotation_fenced_with_think_block_and_prose():
    body = annotation_json([(1, [" query targets the film "], [0.6])])
    text = f'<think>maybe [{{"step": 9}}]</think>Here you go:\n```json\n{body}\n```\nDone.'
    parsed, reason = parse_annotation(text, n_steps=1, k=1)
    assert reason == "ok"
    assert parsed == [StepAnnotation(["query targets the film"], [0.6])]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "unparseable"),
        ("no json here", "unparseable"),
        ('[{"step": 1, "criteria": ["a"], "scores": [0.5]', "unparseable"),  # malformed JSON
        ('{"step": 1, "criteria": ["a"], "scores": [0.5]}', "unparseable"),  # not a list
        ('[{"criteria": ["a"], "scores": [0.5]}]', "unparseable"),  # no step
        ('[{"step": "1", "criteria": ["a"], "scores": [0.5]}]', "unparseable"),
        ('[{"step": 1, "scores": [0.5]}]', "unparseable"),  # no criteria
        ('<think>[{"step": 1, "criteria": ["a"], "scores": [0.5]}]</think>', "unparseable"),
        ('[{"step": 1, "criteria": ["a"], "scores": [0.5]}]', "wrong_step_count"),  # 1 of 2
        (annotation_json([(1, ["a"], [0]), (2, ["a"], [0]), (3, ["a"], [0])]), "wrong_step_count"),
        (annotation_json([(0, ["a"], [0]), (2, ["a"], [0])]), "wrong_step_count"),  # mixed
        (annotation_json([(1, ["a"], [0]), (1, ["a"], [0])]), "wrong_step_count"),  # duplicate
        (annotation_json([(1, ["a", "b"], [0]), (2, ["a"], [0])]), "wrong_k"),
        (annotation_json([(1, ["a"], [0, 0.5]), (2, ["a"], [0])]), "wrong_k"),
        (annotation_json([(1, ["a"], ["high"]), (2, ["a"], [0])]), "wrong_k"),  # non-numeric
        (annotation_json([(1, ["a"], [True]), (2, ["a"], [0])]), "wrong_k"),
        (annotation_json([(1, ["a"], [None]), (2, ["a"], [0])]), "wrong_k"),
        (annotation_json([(1, ["  "], [0]), (2, ["a"], [0])]), "wrong_k"),  # empty criterion
        (annotation_json([(1, [3], [0]), (2, ["a"], [0])]), "wrong_k"),
        (
            '[{"step": 1, "criteria": ["a"], "scores": [NaN]}, '
            '{"step": 2, "criteria": ["a"], "scores": [0]}]',
            "wrong_k",
        ),
        (
            '[{"step": 1, "criteria": "a", "scores": 0}, '
            '{"step": 2, "criteria": ["a"], "scores": [0]}]',
            "wrong_k",
        ),
    ],
)
def test_parse_annotation_rejects(text, reason):
    assert parse_annotation(text, n_steps=2, k=1) == (None, reason)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_step_obj = st.fixed_dictionaries(
    {"step": st.integers(-1, 4) | st.text(max_size=2), "criteria": _json, "scores": _json}
)


@settings(max_examples=300)
@given(
    text=st.text(max_size=200)
    | st.lists(_step_obj, max_size=4).map(json.dumps)
    | _json.map(lambda x: json.dumps(x, allow_nan=True))
    | st.lists(
        st.sampled_from(["[", "]", "{", "}", '"step"', ":", ",", "1", "<think>", "```"])
    ).map("".join),
    n_steps=st.integers(1, 4),
    k=st.integers(1, 5),
)
def test_parse_annotation_never_raises(text, n_steps, k):
    parsed, reason = parse_annotation(text, n_steps, k)
    assert reason in ("ok", "unparseable", "wrong_step_count", "wrong_k")
    assert (parsed is not None) == (reason == "ok")
    if parsed is not None:
        assert len(parsed) == n_steps
        assert all(len(a.criteria) == k and len(a.scores) == k for a in parsed)


def test_parse_annotation_non_text_and_huge_int():
    assert parse_annotation(None, 1, 1) == (None, "unparseable")  # type: ignore[arg-type]
    huge = '[{"step": 1, "criteria": ["a"], "scores": [1' + "0" * 400 + "]}]"
    assert parse_annotation(huge, 1, 1) == (None, "wrong_k")


# --- the teacher's ReAct actions --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Search[Foo (film)]", ("search", "Foo (film)")),
        ("Search[a [b] c]", ("search", "a [b] c")),
        ("Thought: the film first.\nAction: Search[ Foo ]", ("search", "Foo")),
        ("Action: Finish[Bob Stone]\nObservation: made up]", ("answer", "Bob Stone")),
        ("<think>Search[no]</think>finish[yes]", ("answer", "yes")),
        ("Search[x] then Finish[y]", ("search", "x] then Finish[y")),  # last ] of the line
        ("Search[]", ("invalid", None)),
        ("Search[unclosed\n]", ("invalid", None)),
        ("I would search for Foo.", ("invalid", None)),
        ("", ("invalid", None)),
    ],
)
def test_parse_teacher_action(text, expected):
    assert parse_teacher_action(text) == expected


def test_teacher_policy_messages_history_and_budget():
    steps = [
        AgentStep("search", "Search[Foo (film)]", "Foo is a film by Bob.", 3),
        AgentStep("invalid", "hmm", INVALID_OBSERVATION, 2),
    ]
    system, user = teacher_policy_messages("Who directed Foo?", steps, 1)
    assert system["role"] == "system" and "Search[query]" in system["content"]
    assert user["content"] == (
        "Question: Who directed Foo?\n\nTrajectory so far:\nSearch[Foo (film)]\n"
        f"Observation: Foo is a film by Bob.\nhmm\nObservation: {INVALID_OBSERVATION}\n\n"
        "Searches remaining: 1\nYour next action:"
    )
    _, first = teacher_policy_messages("Who?", [], 3)
    assert "Trajectory so far:\n(none)" in first["content"]
    _, forced = teacher_policy_messages("Who?", steps, 0)
    assert forced["content"].endswith(
        "Searches remaining: 0\nNo searches remain: answer now with Finish[answer]."
    )


def test_annotation_messages_show_every_step_and_the_reward():
    steps = [
        AgentStep("search", "Search[Foo]", "Foo is a film.", 3),
        AgentStep("invalid", "hmm", INVALID_OBSERVATION, 2),
        AgentStep("answer", "Finish[Bob]", "", 0, forced=True),
    ]
    system, user = annotation_messages(episode(steps, 1.0, "Who directed Foo?", "Bob"), k=2)
    assert "exactly 2 criteria and 2 scores" in system["content"]
    assert "sum_t mean_k score[t][k] = R" in system["content"]
    assert "-0.7 to -1: causes a wrong answer or a budget violation" in system["content"]
    text = user["content"]
    assert text.startswith("Question: Who directed Foo?\n")
    assert "Step 1 | searches remaining: 3 | forced finish: no | invalid: no\n" in text
    assert (
        "Step 2 | searches remaining: 2 | forced finish: no | invalid: yes\nAction: hmm\n" in text
    )
    assert "Step 3 | searches remaining: 0 | forced finish: yes | invalid: no\n" in text
    assert "Action: Finish[Bob]\nObservation: (none)\n" in text
    assert "Final answer: Bob\nFinal reward R = 1\n" in text
    assert text.endswith(
        "2 criteria and 2 scores for each of the 3 steps (step 1 to 3); the 3 step means must add up to R = 1."
    )


# --- the tiny world's oracle ------------------------------------------------------------------

SUPPORT = ("d-film", "d-director")
RIGHT = episode(  # useful, missed, useful, grounded right answer on the forced turn
    [
        AgentStep("search", "Search[Foo]", "Foo is a film by Bob.", 3, doc_ids=("d-film",)),
        AgentStep("search", "Search[Bobb]", "Bobby is a dog.", 2, doc_ids=("d-dog",)),
        AgentStep("search", "Search[Bob]", "Bob was born in Oslo.", 1, doc_ids=("d-director",)),
        AgentStep("answer", "Finish[Oslo]", "", 0, forced=True),
    ],
    1.0,
    answer="Oslo",
)
WRONG_ANSWER = episode(  # the same searches, then a wrong answer
    [*RIGHT.steps[:3], AgentStep("answer", "Finish[Bergen]", "", 0, forced=True)],
    0.0,
    answer="Bergen",
)
WASTEFUL = episode(  # useful, redundant (same document again), invalid, search on the forced turn
    [
        AgentStep("search", "Search[Foo]", "Foo is a film by Bob.", 3, doc_ids=("d-film",)),
        AgentStep("search", "Search[Foo film]", "Foo is a film by Bob.", 2, doc_ids=("d-film",)),
        AgentStep("invalid", "hmm", INVALID_OBSERVATION, 1),
        AgentStep("search", "Search[Bob]", "", 0, forced=True),
    ],
    0.0,
)
GUESS = episode([AgentStep("answer", "Finish[Oslo]", "", 3)], 1.0, answer="Oslo")


def test_oracle_outcomes():
    assert oracle_outcomes(RIGHT, SUPPORT) == [
        "useful_search",
        "missed_search",
        "useful_search",
        "grounded_right_answer",
    ]
    assert oracle_outcomes(WRONG_ANSWER, SUPPORT)[3] == "misread_wrong_answer"
    assert oracle_outcomes(WASTEFUL, SUPPORT) == [
        "useful_search",
        "redundant_search",
        "invalid",
        "forced_search",
    ]
    assert oracle_outcomes(GUESS, SUPPORT) == ["guessed_right_answer"]
    premature = episode([RIGHT.steps[0], WRONG_ANSWER.steps[3]], 0.0)
    assert oracle_outcomes(premature, SUPPORT)[1] == "premature_wrong_answer"
    seen_again = episode([RIGHT.steps[1], RIGHT.steps[1]], 0.0)  # no support, same doc twice
    assert oracle_outcomes(seen_again, SUPPORT) == ["missed_search", "redundant_search"]


def _means(annotations: list[StepAnnotation]) -> list[float]:
    return [sum(a.scores) / len(a.scores) for a in annotations]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_oracle_annotation_meets_the_constraint(k):
    for ep in (RIGHT, WRONG_ANSWER, WASTEFUL, GUESS):
        annotations = oracle_annotation(ep, k, SUPPORT)
        assert len(annotations) == len(ep.steps)
        for a in annotations:
            assert len(a.criteria) == k and len(set(a.criteria)) == k
            assert all(isinstance(c, str) and c.strip() for c in a.criteria)
            assert len(a.scores) == k and all(-1.0 <= x <= 1.0 for x in a.scores)
        assert abs(sum(_means(annotations)) - ep.reward) < 1e-6
        assert oracle_annotation(ep, k, SUPPORT) == annotations  # deterministic

    right, wrong, wasteful = (
        _means(oracle_annotation(e, k, SUPPORT)) for e in (RIGHT, WRONG_ANSWER, WASTEFUL)
    )
    assert right[0] > right[1] and right[2] > right[1]  # useful > missed
    assert (
        wasteful[0] > wasteful[1] > wasteful[3] and wasteful[0] > wasteful[2]
    )  # > redundant, invalid
    assert right[3] > wrong[3]  # the right answer above the wrong one


def test_oracle_annotation_criteria_by_outcome():
    [useful, missed, _, answer] = oracle_annotation(RIGHT, 3, SUPPORT)
    assert useful.criteria[0] == "query names next hop"
    assert missed.criteria[1] == "finds new support"
    assert answer.criteria[0] == "answer is correct"
    [_, redundant, invalid, forced] = oracle_annotation(WASTEFUL, 3, SUPPORT)
    assert redundant.criteria[0] == "no repeated search"
    assert invalid.criteria[0] == "valid action format"
    assert forced.criteria[0] == "answers when forced"
    with pytest.raises(ValueError):
        oracle_annotation(RIGHT, 6, SUPPORT)


def _played(steps: list[Step]) -> Trajectory:
    return Trajectory("g", 0, "q", "Q?", ["gold"], [1], steps=steps)


def test_oracle_support_by_id_leaves_the_episode_as_it_is():
    traj = _played([Step("search", 0, 1, "Foo", [Doc("d-film", "Other title", "", 0.0)])] * 4)
    assert oracle_support(RIGHT, traj, {"supporting_ids": list(SUPPORT)}) == (RIGHT, list(SUPPORT))
    assert oracle_support(RIGHT, traj, {"answer_type": "span"}) is None


def test_oracle_support_by_title_counts_a_paragraph_by_its_title_whichever_row():
    """HotpotQA names supporting documents by title: the same paragraph under another corpus row
    is the same evidence, a search that finds it again is redundant, and titles compare as
    ``eviback.oracle`` compares them (case and surrounding space ignored)."""

    def search(*docs: tuple[str, str]) -> Step:
        return Step("search", 0, 1, "q", [Doc(i, t, "text", 1.0) for i, t in docs])

    traj = _played(
        [
            search(("p3", "Foo (film)"), ("p9", "Dog")),  # finds the film
            search(("p41", " foo (FILM)"), ("p9", "Dog")),  # the film again, another row
            search(("p7", "Bob")),  # finds the director
            Step("answer", 0, 1),
        ]
    )
    steps = [
        AgentStep("search", "Search[Foo]", "…", 3, doc_ids=("p3", "p9")),
        AgentStep("search", "Search[Foo film]", "…", 2, doc_ids=("p41", "p9")),
        AgentStep("search", "Search[Bob]", "…", 1, doc_ids=("p7",)),
        AgentStep("answer", "Finish[Oslo]", "", 0, forced=True),
    ]
    ep = episode(steps, 1.0, answer="Oslo")
    keyed, support = oracle_support(ep, traj, {"supporting_titles": ["Foo (film)", "Bob"]})
    assert support == ["foo (film)", "bob"]
    assert [s.doc_ids for s in keyed.steps] == [
        ("foo (film)", "dog"),
        ("foo (film)", "dog"),
        ("bob",),
        (),
    ]
    assert [s.doc_ids for s in ep.steps][0] == ("p3", "p9")  # the played episode is kept
    assert oracle_outcomes(keyed, support) == [
        "useful_search",
        "redundant_search",
        "useful_search",
        "grounded_right_answer",
    ]
    # by id the other row is a new document, not a supporting one: a missed search
    assert oracle_outcomes(ep, ["p3", "p7"])[1] == "missed_search"
    assert oracle_outcomes(ep, ["p41", "p7"])[:2] == ["missed_search", "useful_search"]
    with pytest.raises(ValueError, match="4 steps in the episode, 3 in its trajectory"):
        oracle_support(ep, _played(traj.steps[:3]), {"supporting_titles": ["Bob"]})


def test_oracle_support_on_real_hotpotqa_gold_paths(tiny_world):
    """The format warmup's gold paths over six real HotpotQA questions (tests/test_warmup.py: the
    titles find their paragraph in 11 of 12 searches; "Tom Clancy" loses to three books named
    after him): each search the oracle calls useful exactly when its title was among the
    documents, and the right answer grounded exactly when both were."""
    from transformers import AutoTokenizer

    from arco.steps import episode_from_trajectory
    from common.data import load_qa
    from common.retrieval.bm25 import BM25Retriever
    from common.rollout.agent import AgentConfig
    from common.smol import data
    from common.warmup import gold_trajectories

    examples = load_qa(data.rows()[:6], source="hotpotqa")
    docs = [
        Doc(f"{i}.{j}", p["title"], p["text"], 0.0)
        for i, ex in enumerate(examples)
        for j, p in enumerate(ex.metadata["paragraphs"])
    ]
    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "model")
    trajs = gold_trajectories(
        examples, tokenizer, BM25Retriever.from_docs(docs), AgentConfig(max_obs_tokens=64)
    )
    useful, grounded = [], []
    for ex, traj in zip(examples, trajs, strict=True):
        ep = episode_from_trajectory(traj, tokenizer, max_searches=4)
        assert ep.reward == 1.0
        keyed, support = oracle_support(ep, traj, ex.metadata)
        found = [s.query in [d.title for d in s.docs] for s in traj.steps[:-1]]
        outcomes = oracle_outcomes(keyed, support)
        assert outcomes[:-1] == ["useful_search" if f else "missed_search" for f in found]
        assert outcomes[-1] == ("grounded_right_answer" if all(found) else "guessed_right_answer")
        useful += found
        grounded.append(outcomes[-1] == "grounded_right_answer")
    assert sum(useful) == 11 and len(useful) == 12
    assert sum(grounded) == 5


# --- the LLM path against a scripted OpenAI-compatible server ---------------------------------

ADA, FOO, BROKEN = (
    "Where was Ada Lovelace born?",
    "Who directed Foo (film)?",
    "Which FAIL question?",
)
# Policy replies by question and turn; a turn's n-th identical prompt gets option n (mod len).
POLICY_SCRIPT = {
    ADA: [
        [
            "Thought: I need Ada.\nAction: Search[Ada Lovelace (mathematician)]\nObservation: x",
            "Finish[Paris]",
        ],
        ["Action: Finish[London]"],
    ],
    FOO: [
        ["Search[Foo (film)]"],
        ["I am not sure what to do."],
        ["Search[a [b] c]"],
        ["<think>hm</think>Search[again]"],
    ],
    BROKEN: [["Search[x]"], [None]],  # None: HTTP 500
}
DOCS = {
    "Ada Lovelace (mathematician)": ("Ada Lovelace was born in London.", ("d-ada",)),
    "Foo (film)": ("Foo is a film by Bob Stone.", ("d-foo",)),
}
GOOD_1 = annotation_json([(1, ["find Ada's page"], [0.5]), (2, ["answer London"], [0.5])])
ANNOTATION_SCRIPT = {  # by question: the reply text, None for HTTP 500, "SLEEP" for a timeout
    ADA: f"<think>R = 1, two steps.</think>\n```json\n{GOOD_1}\n```",
    FOO: annotation_json(
        [(0, ["x"], [0.0]), (1, ["y"], [-0.5]), (2, ["z"], [0.0]), (3, ["w"], [0.5])]
    ),
    "MALFORMED?": '[{"step": 1, "criteria": ["a"], "scores": [0.3]',
    "ERROR?": None,
    "SLOW?": "SLEEP",
}
SLEEP_S, TIMEOUT_S, RETRIES = 1.5, 0.4, 1


@dataclass
class ServerState:
    seen: Counter = field(default_factory=Counter)  # user prompt -> times asked
    bodies: list[dict] = field(default_factory=list)
    sleeping: int = 0


def make_app(state: ServerState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state.bodies.append(body)
        system, user = (m["content"] for m in body["messages"])
        question = re.search(r"^Question: (.*)$", user, re.M).group(1)
        if system.startswith("You annotate"):
            text = ANNOTATION_SCRIPT[question]
        else:
            turn = user.count("\nObservation: ")
            options = POLICY_SCRIPT[question][turn]
            text = options[state.seen[user] % len(options)]
        state.seen[user] += 1
        if text is None:
            return JSONResponse({"error": "boom"}, status_code=500)
        if text == "SLEEP":
            state.sleeping += 1
            try:
                await asyncio.sleep(SLEEP_S)
            finally:
                state.sleeping -= 1
        message = {"role": "assistant", "content": text}
        usage = {"prompt_tokens": len(user.split()), "completion_tokens": len(text.split())}
        return {"choices": [{"index": 0, "message": message}], "usage": usage}

    return app


@pytest.fixture(scope="module")
def server():
    state = ServerState()
    with serve(make_app(state)) as port:
        yield state, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def srv(server):
    state, url = server
    deadline = time.time() + 5
    while state.sleeping:  # a request left sleeping by a timeout
        assert time.time() < deadline
        time.sleep(0.05)
    state.seen.clear()
    state.bodies.clear()
    return state, url


def make_client(url: str, **kw) -> LLMClient:
    return LLMClient(url, "teacher", **{"retries": RETRIES, "backoff": 0.01, "timeout": 5.0, **kw})


def fake_search(example: QAExample, query: str) -> tuple[str, tuple[str, ...]]:
    return DOCS.get(query, (f"No document for {query}.", ()))


def test_teacher_rollouts_play_the_script(srv, tmp_path):
    state, url = srv
    examples = [
        QAExample("ada", ADA, ["London"], {"supporting_ids": ["d-ada"]}),
        QAExample("foo", FOO, ["Bob Stone"]),
        QAExample("broken", BROKEN, ["x"]),
    ]
    client = make_client(url, cache_dir=tmp_path / "cache", temperature=1.0)
    episodes, counts = teacher_rollouts(client, examples, fake_search, samples=2, max_searches=3)

    assert [(e.question_id, e.metadata["sample"]) for e in episodes] == [
        ("ada", 0),
        ("ada", 1),
        ("foo", 0),
        ("foo", 1),
    ]
    ada0, ada1, foo0, foo1 = episodes
    assert ada0.steps == [
        AgentStep(
            "search",
            "Thought: I need Ada.\nAction: Search[Ada Lovelace (mathematician)]",
            "Ada Lovelace was born in London.",
            3,
            doc_ids=("d-ada",),
        ),
        AgentStep("answer", "Action: Finish[London]", "", 2),
    ]
    assert (ada0.answer, ada0.reward, ada0.metadata["supporting_ids"]) == ("London", 1.0, ["d-ada"])
    assert ada1.steps == [AgentStep("answer", "Finish[Paris]", "", 3)]  # the second sample differs
    assert (ada1.answer, ada1.reward) == ("Paris", 0.0)
    assert foo0.steps == [
        AgentStep(
            "search", "Search[Foo (film)]", "Foo is a film by Bob Stone.", 3, doc_ids=("d-foo",)
        ),
        AgentStep("invalid", "I am not sure what to do.", INVALID_OBSERVATION, 2),
        AgentStep("search", "Search[a [b] c]", "No document for a [b] c.", 1),
        AgentStep("search", "Search[again]", "", 0, forced=True),
    ]
    assert (foo0.answer, foo0.reward) == (None, 0.0)
    assert foo1.steps == foo0.steps
    assert counts == {
        "finished": 4,
        "correct": 1,
        "request_failed": 2,
        "invalid_steps": 2,
        "forced_searches": 2,
    }
    forced_prompt = [b for b in state.bodies if FOO in b["messages"][1]["content"]][-1]
    assert "Searches remaining: 0\nNo searches remain" in forced_prompt["messages"][1]["content"]
    assert all(b["temperature"] == 1.0 for b in state.bodies)
    broken_turn_1 = [b for b in state.bodies if "Observation: No document for x." in str(b)]
    assert len(broken_turn_1) == 2 * (RETRIES + 1)  # both samples, every retry

    # A rerun replays both samples from the cache; only the failed requests are asked again.
    asked = len(state.bodies)
    again, again_counts = teacher_rollouts(client, examples, fake_search, samples=2)
    assert again == episodes and again_counts == counts
    assert all(BROKEN in str(b) for b in state.bodies[asked:])


def test_annotate_parses_good_answers_and_counts_the_dropped(srv):
    state, url = srv
    ada = episode(
        [
            AgentStep("search", "Search[Ada]", "Ada was born in London.", 3),
            AgentStep("answer", "Finish[London]", "", 2),
        ],
        1.0,
        ADA,
        "London",
    )
    foo = episode(
        [AgentStep("search", "Search[Foo]", "doc", 3 - t) for t in range(3)]
        + [AgentStep("search", "Search[Bob]", "", 0, forced=True)],
        0.0,
        FOO,
    )
    one_step = [AgentStep("answer", "Finish[x]", "", 3)]
    batch = [
        episode(one_step, 0.0, "SLOW?"),
        ada,
        episode(one_step, 0.0, "MALFORMED?"),
        episode(one_step, 0.0, "ERROR?"),
        foo,
    ]
    client = make_client(url, timeout=TIMEOUT_S)
    start = time.perf_counter()
    result = annotate(client, batch, k=1)
    assert time.perf_counter() - start < SLEEP_S * (RETRIES + 1)  # timed out, not waited out

    slow, good_ada, malformed, error, good_foo = result.annotations
    assert slow is None and malformed is None and error is None
    assert good_ada == [
        StepAnnotation(["find Ada's page"], [0.5]),
        StepAnnotation(["answer London"], [0.5]),
    ]
    assert [a.scores for a in good_foo] == [[0.0], [-0.5], [0.0], [0.5]]
    assert result.counts == {
        "ok": 2,
        "unparseable": 1,
        "wrong_step_count": 0,
        "wrong_k": 0,
        "request_failed": 2,
    }
    asked = Counter(
        re.search(r"^Question: (.*)$", b["messages"][1]["content"], re.M).group(1)
        for b in state.bodies
    )
    assert asked == {"SLOW?": RETRIES + 1, ADA: 1, "MALFORMED?": 1, "ERROR?": RETRIES + 1, FOO: 1}
    assert result.usage["failures"] == 2 and result.usage["calls"] == 5
