"""The agent pieces of HotpotQA's distractor setting: ReAct arguments that keep their brackets,
observations without titles, and per-question retrieval inside ``run_agent``.

The policy is ``ScriptedEngine``: each question's turns are fixed texts, played token by token
with the engine's stop rules (a stop string ends a completion at the token that completes it),
so every rollout is known in advance without a model.
"""

from __future__ import annotations

import pytest

from common.data import QAExample
from common.retrieval import Doc, PerQuestionRetriever
from common.rollout.agent import AgentConfig, build_prompt_ids, encode_text, run_agent
from common.rollout.engine import Completion, stop_length
from common.rollout.protocols import get_protocol
from common.tinyworld.tokenizer import build_tokenizer

REACT = get_protocol("react")
SEARCH_R1 = get_protocol("search_r1")
LOGPROB = -0.25


class ScriptedEngine:
    """Plays ``turns[question]`` (texts), one row per question (n = 1).

    Each call continues a row's current turn: up to the token that completes a stop string, or
    ``max_tokens``; a turn played to its end moves the row to the next one. A row is known by
    its question's chat prompt, which every later prompt of that row starts with.
    """

    def __init__(self, tokenizer, protocol, turns: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.rows = {
            tuple(build_prompt_ids(tokenizer, protocol, q)): [encode_text(tokenizer, t) for t in ts]
            for q, ts in turns.items()
        }
        self.at = {key: (0, 0) for key in self.rows}  # (turn, token offset)
        self.calls: list[tuple[list[list[int]], object]] = []

    def generate(self, prompts, params, adapter=None):
        self.calls.append(([list(p) for p in prompts], params))
        assert params.n == 1
        return [[self._continue(p, params)] for p in prompts]

    def _continue(self, prompt, params) -> Completion:
        (key,) = [k for k in self.rows if tuple(prompt[: len(k)]) == k]
        turn, offset = self.at[key]
        rest = self.rows[key][turn][offset:]
        to_stop, stopped = stop_length(rest, self._piece, params.stop, set())
        n = min(to_stop, params.max_tokens)
        done = offset + n == len(self.rows[key][turn])  # a turn without a stop ends the message
        self.at[key] = (turn + 1, 0) if done else (turn, offset + n)
        reason = "stop" if (stopped and n == to_stop) or done else "length"
        return Completion(rest[:n], [LOGPROB] * n, self.tokenizer.decode(rest[:n]), reason)

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token])


PARAGRAPHS = {
    "q1": [
        {"title": "Foo (film)", "text": "Foo is a 1999 film directed by Ana Bell."},
        {"title": "Foo (band)", "text": "Foo are a band from Leeds."},
    ],
    "q2": [
        {"title": "Ana Bell", "text": "Ana Bell was born in Porto."},
        {"title": "Porto", "text": "Porto is a city in Portugal."},
    ],
}


@pytest.fixture(scope="module")
def tok():
    texts = [p["text"] for ps in PARAGRAPHS.values() for p in ps]
    return build_tokenizer([*texts, REACT.user_prompt("?")], vocab_size=512)


# -- the ReAct parser ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, kind, arg",
    [
        ("Search[Foo (film)]", "search", "Foo (film)"),
        ("Thought: the film [1] first.\nSearch[a [b] c]", "search", "a [b] c"),
        ("Search[[x]]", "search", "[x]"),
        ("Finish[ Porto (city) ]", "answer", "Porto (city)"),
        ("Search[q] Finish[x]", "search", "q"),  # one action a turn: the first
        ("Search[]", "invalid", None),
        ("Lookup[Foo]", "invalid", None),
        ("Search[a [b]", "invalid", None),  # cut off inside the argument
        ("Thought: no action [1]", "invalid", None),
    ],
)
def test_react_arguments_keep_brackets_and_parentheses(text, kind, arg):
    action = REACT.parse(text)
    assert action.kind == kind
    assert (action.query if kind == "search" else action.answer) == arg


def test_only_a_bracket_inside_an_open_action_resumes_the_turn():
    assert REACT.unfinished("Search[a [b]")
    assert REACT.unfinished("Thought: hm\nFinish[x [y]")
    assert not REACT.unfinished("Search[a [b] c]")
    assert not REACT.unfinished("Search[a [b")  # not stopped on a ']'
    assert not REACT.unfinished("Thought: see [1]")  # no action: invalid, as before
    assert not REACT.unfinished("Lookup[x]")
    assert not SEARCH_R1.unfinished("<search> a [b]")


def test_observation_without_titles():
    docs = [Doc("0", "Foo (film)", "Foo is a film.", 1.0), Doc("1", "Porto", "A city.", 0.5)]
    assert REACT.observation(docs) == (
        "\nObservation: ",
        "[1] Foo (film): Foo is a film. [2] Porto: A city.",
        "\nThought:",
    )
    assert REACT.observation(docs[:1], titles=False)[1] == "Foo is a film."
    assert REACT.observation(docs, titles=False)[1] == "Foo is a film.\nA city."
    assert SEARCH_R1.observation(docs, titles=False)[1] == "Doc 1 Foo is a film.\nDoc 2 A city.\n"


# -- the agent loop -----------------------------------------------------------------------------
def react_cfg(**kw) -> AgentConfig:
    base = dict(
        protocol="react", max_turns=3, topk=1, max_turn_tokens=48, max_obs_tokens=64,
        temperature=0.0, max_context=2048,
    )  # fmt: skip
    return AgentConfig(**{**base, **kw})


def test_nested_brackets_turn_is_resumed_into_one_sampled_step(tok):
    question = "Who directed Foo?"
    search = "Thought: the film.\nSearch[Foo [film] (1999)]"
    engine = ScriptedEngine(tok, REACT, {question: [search, "Finish[Ana Bell]"]})
    ex = QAExample("q1", question, ["Ana Bell"], {"paragraphs": PARAGRAPHS["q1"]})
    (t,) = run_agent(engine, tok, PerQuestionRetriever(), [ex], 1, react_cfg(obs_titles=False))

    assert [(s.kind, s.query) for s in t.steps] == [
        ("search", "Foo [film] (1999)"),
        ("answer", None),
    ]
    assert t.answer == "Ana Bell"
    # the search turn took two calls: stopped at "film]", resumed from where it stopped
    first, resumed, finish = engine.calls
    prompt = build_prompt_ids(tok, REACT, question)
    cut = search.index("]") + 1
    assert first[0] == [prompt]
    assert resumed[0] == [prompt + encode_text(tok, search[:cut])]
    assert resumed[1].max_tokens == 48 - len(encode_text(tok, search[:cut]))
    # ... and it is one step, all of it sampled
    s = t.steps[0]
    assert t.response_ids[s.start : s.end] == encode_text(tok, search)
    assert t.loss_mask[s.start : s.end] == [1] * (s.end - s.start)
    assert s.logprobs == [LOGPROB] * (s.end - s.start)
    obs = tok.decode(t.response_ids[s.end : t.steps[1].start])
    assert obs == "\nObservation: Foo is a 1999 film directed by Ana Bell.\nThought:"
    assert finish[0] == [prompt + t.response_ids[: t.steps[1].start]]


def test_resumed_turn_keeps_the_turn_token_limit(tok):
    question = "Who directed Foo?"
    search = "Search[Foo [film] and then a very long argument that never closes in time]"
    engine = ScriptedEngine(tok, REACT, {question: [search]})
    ex = QAExample("q1", question, ["Ana Bell"], {"paragraphs": PARAGRAPHS["q1"]})
    cfg = react_cfg(max_turns=1, max_turn_tokens=12)
    (t,) = run_agent(engine, tok, PerQuestionRetriever(), [ex], 1, cfg)
    first, resumed, _ = engine.calls
    assert resumed[1].max_tokens < 12
    s = t.steps[0]
    assert (s.kind, s.end - s.start) == ("invalid", 12)
    assert t.response_ids[:12] == encode_text(tok, search)[:12]
    assert t.num_invalid == 2 and t.forced_terminated


class RecordingPerQuestion:
    def __init__(self, inner: PerQuestionRetriever):
        self.inner, self.calls = inner, []

    def search_for(self, question, queries, k):
        self.calls.append((question, list(queries), k))
        return self.inner.search_for(question, queries, k)


def test_each_question_searches_only_its_own_paragraphs(tok):
    """Two questions search the same words in one turn; each sees its own paragraphs only.
    A question without paragraphs in its metadata is looked up by its id."""
    q1, q2 = "Who directed Foo?", "Where was Ana Bell born?"
    turns = {q: ["Search[Foo Ana Bell Porto]", "Finish[x]"] for q in (q1, q2)}
    engine = ScriptedEngine(tok, REACT, turns)
    retriever = RecordingPerQuestion(PerQuestionRetriever({"q2": PARAGRAPHS["q2"]}))
    examples = [
        QAExample("q1", q1, ["Ana Bell"], {"paragraphs": PARAGRAPHS["q1"]}),
        QAExample("q2", q2, ["Porto"]),
    ]
    t1, t2 = run_agent(engine, tok, retriever, examples, 1, react_cfg(topk=2))
    assert {d.title for d in t1.steps[0].docs} == {"Foo (film)", "Foo (band)"}
    assert {d.title for d in t2.steps[0].docs} == {"Ana Bell", "Porto"}
    assert retriever.calls == [
        (PARAGRAPHS["q1"], ["Foo Ana Bell Porto"], 2),
        ("q2", ["Foo Ana Bell Porto"], 2),
    ]
