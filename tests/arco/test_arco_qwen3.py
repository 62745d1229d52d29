"""ARCO's paper configs under Qwen3's real tokenizer (tests/qwen_tokenizer.py): the policy's
longest episode and μ's longest rubric prompt, with its criteria, fit the configured context.

The worst case is built, not sampled: every search returns an observation cut at the config's
``agent.max_obs_tokens`` (a paragraph of Wikipedia-2018 text, tests/data/retrieval, long enough to
be cut), every action is ``agent.max_turn_tokens`` long, and μ's prompt is the one for the last
step, whose history holds every search.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from loopback_server import serve

from arco.config import ArcoConfig
from arco.environment import build_environment
from arco.rubrics import rubric_items
from arco.steps import AgentStep, Episode
from common.config import load_config
from common.data import load_qa
from common.retrieval.base import Doc, parse_row
from common.rollout.agent import build_prompt_ids, encode_text, first_budget, observation_ids
from common.rollout.engine import Completion
from common.rollout.protocols import get_protocol

ROOT = Path(__file__).resolve().parents[2]
# Qwen3-4B only: the Llama-3.2-3B configs have another tokenizer
PAPER_CONFIGS = sorted((ROOT / "arco" / "configs").glob("qwen3_4b_*.yaml"))


def long_document() -> Doc:
    path = ROOT / "tests" / "data" / "retrieval" / "wiki18_sample_corpus.jsonl"
    with path.open(encoding="utf-8") as f:
        docs = [parse_row(json.loads(line), f"{path}:{i}") for i, line in enumerate(f, 1)]
    return Doc("long", "", " ".join(d.text for d in docs), 0.0)  # ten passages: ~1,600 tokens


def worst_episode(tokenizer, cfg: ArcoConfig) -> Episode:
    _, agent = build_environment(cfg.env, cfg.agent)
    protocol = get_protocol(agent.protocol)
    obs_ids = observation_ids(tokenizer, protocol, [long_document()], agent.max_obs_tokens)
    assert len(obs_ids) == agent.max_obs_tokens  # cut at the limit, as the agent cuts it
    obs = tokenizer.decode(obs_ids, skip_special_tokens=True).strip()
    # an action of max_turn_tokens tokens: a query of filler words in the protocol's form
    filler = " ".join(["Jorgensen"] * agent.max_turn_tokens)
    query = tokenizer.decode(encode_text(tokenizer, filler)[: agent.max_turn_tokens - 4])
    search = protocol.format_search(query)
    steps = [
        AgentStep("search", search, obs, cfg.env.max_searches - i)
        for i in range(cfg.env.max_searches)
    ]
    steps.append(AgentStep("answer", protocol.format_answer(query), "", 0, forced=True))
    question = (
        "Which American film director, born in the same city as the founder of the studio that "
        "released the film, directed the 1994 film that won the award for best screenplay?"
    )
    return Episode("q", question, ["x"], steps, "x", 1.0)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_longest_episode_and_rubric_prompt_fit_the_context(path, qwen3_tokenizer):
    cfg = load_config(ArcoConfig, path)
    tok = qwen3_tokenizer
    _, agent = build_environment(cfg.env, cfg.agent)
    ep = worst_episode(tok, cfg)
    # the policy: prompt + every turn + every observation within its context and the engine's
    protocol = get_protocol(agent.protocol)
    prompt = build_prompt_ids(tok, protocol, ep.question, agent.instruction, first_budget(agent))
    turns = cfg.env.max_searches + 1  # the searches, then the (forced) answer
    longest = (
        len(prompt) + turns * agent.max_turn_tokens + cfg.env.max_searches * (agent.max_obs_tokens)
    )
    assert longest <= agent.max_context <= cfg.engine.max_model_len
    # μ: the last step's prompt (every search in its history) plus K criteria of
    # rubric.max_new_tokens, under both prefixes (the release's "after" shows one step more)
    for prefix in ("before", "after"):
        items = rubric_items(
            [ep], tok, cfg.rubric.k, prefix, cfg.rubric.max_obs_chars, **cfg.rubric.templates()
        )
        assert [it.step for it in items] == list(range(len(ep.steps)))
        last = max(len(it.prompt_ids) for it in items)
        assert last == len(items[-1].prompt_ids)  # the history only grows
        assert last > cfg.env.max_searches * (agent.max_obs_tokens - 16)  # every observation
        assert last + cfg.rubric.max_new_tokens + 1 <= cfg.engine.max_model_len
    # the chat template is Qwen3's: the prompt opens a system turn and ends on the assistant's
    assert items[-1].prompt_ids[:3] == tok.encode("<|im_start|>system\n", add_special_tokens=False)


def test_rubric_prompt_of_a_short_history_counts_its_parts(qwen3_tokenizer):
    """A one-search episode: μ's prompt for the answer step holds the observation once, and the
    "after" prefix adds exactly the step's own action line (the answer has no observation)."""
    cfg = load_config(ArcoConfig, PAPER_CONFIGS[0])
    tok = qwen3_tokenizer
    ep = worst_episode(tok, cfg)
    ep = replace(ep, steps=[ep.steps[0], ep.steps[-1]])
    before, after = (
        rubric_items([ep], tok, cfg.rubric.k, p, **cfg.rubric.templates())[-1].prompt_ids
        for p in ("before", "after")
    )
    text_before, text_after = tok.decode(before), tok.decode(after)
    assert text_before.count(ep.steps[0].observation) == 1
    assert f"Action: {ep.steps[-1].action}\n" in text_after
    assert f"Action: {ep.steps[-1].action}\n" not in text_before


# -- one play, one rubric prompt: the warmup's text episodes and RL's token trajectories -------
SAMPLE = ROOT / "tests" / "data" / "retrieval" / "hotpotqa_distractor_sample.jsonl"
REACT_EXPLANATION = "Invalid action. Use Search[query] or Finish[answer]."
SEARCH_R1_EXPLANATION = (
    "My previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again."
)


class ReplayEngine:
    """Plays given turns (texts) as the policy's samples, one trajectory, one turn a call; a turn
    with a stop string stopped on it, one without ran to its token limit."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer = tokenizer
        self.turns = [encode_text(tokenizer, a) for a in turns]

    def generate(self, prompts, params, adapter=None):
        (ids,) = [self.turns.pop(0) for _ in prompts]
        text = self.tokenizer.decode(ids)
        reason = "stop" if any(s in text for s in params.stop) else "length"
        return [[Completion(ids, [-0.5] * len(ids), text, reason)]]


def wander_play(ex, search, finish) -> list[str]:
    """A search of the first supporting title (after a thought), an invalid turn, a search of the
    second, then the gold answer on the forced turn."""
    first, second = ex.metadata["supporting_titles"]
    return [
        f"Thought: I should look up {first}.\nAction: {search(first)}",
        "I am not sure what to do.",
        f"Action: {search(second)}",
        f"Action: {finish(ex.golden_answers[0])}",
    ]


def paragraph(ex, title: str) -> tuple[str, str]:
    """(doc id, text) of the question's paragraph with that title."""
    (found,) = [
        (str(i), p["text"]) for i, p in enumerate(ex.metadata["paragraphs"]) if p["title"] == title
    ]
    return found


@pytest.fixture
def teacher_server():
    """An OpenAI-compatible loopback server: the player plays ``wander_play`` in ReAct (its turn
    read off "Searches remaining: n"), the annotator answers nothing usable."""
    rows = {ex.question.strip(): ex for ex in load_qa(SAMPLE)}
    app = FastAPI()

    @app.post("/{role}/v1/chat/completions")
    async def chat(role: str, request: Request):
        user = (await request.json())["messages"][1]["content"]
        if role == "player":
            ex = rows[re.search(r"^Question: (.*)$", user, re.M).group(1).strip()]
            turn = 3 - int(re.search(r"^Searches remaining: (\d+)$", user, re.M).group(1))
            text = wander_play(ex, "Search[{}]".format, "Finish[{}]".format)[turn]
        else:
            text = "no annotation"
        message = {"role": "assistant", "content": text}
        return {"choices": [{"index": 0, "message": message}], "usage": {}}

    with serve(app) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("prefix", ["before", "after"])
def test_warmup_and_rl_build_the_same_rubric_prompts_for_one_play(
    qwen3_tokenizer, teacher_server, tmp_path, prefix
):
    """The LLM teacher's warmup episode (``collect_llm``: text) and the policy's RL episode
    (``run_agent`` + ``episode_from_trajectory``: token ids) of the same ReAct play (a search,
    an invalid turn, a search, a forced finish) give μ the same rubric prompts, ids and text,
    in the paper config (its budget statement on): each observation once, as the environment's
    text, the invalid turn's explanation as its observation, no forced-finish message and no
    budget statement."""
    from arco import warmup
    from arco.steps import episode_from_trajectory
    from arco.trainer import make_rubric_items
    from common.rollout import run_agent

    tok = qwen3_tokenizer
    url = teacher_server
    cfg = load_config(
        ArcoConfig,
        ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml",
        [
            f"assets.teacher_endpoint={url}/player/v1",
            f"assets.annotator_endpoint={url}/annotator/v1",
            "warmup.samples=1",
            f"rubric.prefix={prefix}",
        ],
    )
    ex = load_qa(SAMPLE)[2]  # Ken Pruitt / Florida Senate: both paragraphs short, never cut
    retriever, agent = build_environment(cfg.env, cfg.agent)
    assert agent.state_budget and agent.protocol == "react"
    _, (warm,), _, _ = warmup.collect_llm(cfg, tok, retriever, agent, [ex], tmp_path / "cache")

    play = [s.action for s in warm.steps]
    (traj,) = run_agent(ReplayEngine(tok, play), tok, retriever, [ex], 1, agent)
    rl = episode_from_trajectory(traj, tok, cfg.env.max_searches)

    # hand-computed: the steps both paths must give
    (id1, text1), (id2, text2) = (paragraph(ex, t) for t in ex.metadata["supporting_titles"])
    expected = [
        AgentStep("search", play[0], text1, 3, False, (id1,)),
        AgentStep("invalid", play[1], REACT_EXPLANATION, 2),
        AgentStep("search", play[2], text2, 1, False, (id2,)),
        AgentStep("answer", "Action: Finish[40 members]", "", 0, True),
    ]
    assert warm.steps == expected
    assert rl.steps == expected
    # the policy did see the frame, the budget and the forced message: inserted, not in the loss
    inserted = tok.decode(
        [i for i, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m]
    )
    note = "search(es) remaining. Use them wisely before submitting your answer."
    assert "\nYou have 3 " + note in tok.decode(traj.prompt_ids)
    assert inserted == (
        f"\nObservation: {text1}\nYou have 2 {note}\nThought:"
        f"\nObservation: {REACT_EXPLANATION}\nYou have 1 {note}\nThought:"
        f"\nObservation: {text2}\nThought:"  # the forced turn comes next: its message instead
        "\nObservation: The search budget is used up. Finish now.\nThought:"
    )

    warm_items = make_rubric_items(cfg, [warm], tok)
    rl_items = make_rubric_items(cfg, [rl], tok)
    assert [it.prompt_ids for it in rl_items] == [it.prompt_ids for it in warm_items]
    texts = [tok.decode(it.prompt_ids) for it in rl_items]
    assert texts == [tok.decode(it.prompt_ids) for it in warm_items]
    last = texts[-1]
    assert last.count(f"Observation: {text1}\n") == 1
    assert last.count(f"Observation: {text2}\n") == 1
    assert f"Observation: {REACT_EXPLANATION}\n" in last
    assert "Observation: Observation" not in last and "Thought:\n" not in last
    assert "budget is used up" not in last and "search(es) remaining" not in last
    budget = {"before": 0, "after": 1}[prefix]  # after: 3 minus the 2 searches (release)
    assert f"Searches remaining before this action: {budget}\n" in last


def test_rl_episode_under_search_r1_holds_the_environments_text(qwen3_tokenizer):
    """Under Search-R1's tags the text view drops the ``<information>`` frame and the budget
    statement; the invalid turn's observation is the protocol's explanation; the step before
    the forced turn does not hold the forced-answer message."""
    from arco.steps import episode_from_trajectory
    from common.data import load_qa
    from common.retrieval.per_question import PerQuestionRetriever
    from common.rollout import run_agent
    from common.rollout.agent import AgentConfig

    tok = qwen3_tokenizer
    ex = load_qa(SAMPLE)[2]
    agent = AgentConfig(
        protocol="search_r1", max_turns=3, topk=1, obs_titles=False, state_budget=True
    )
    play = wander_play(ex, "<search> {} </search>".format, "<answer> {} </answer>".format)
    play = [p.replace("Action: ", "") for p in play]
    (traj,) = run_agent(ReplayEngine(tok, play), tok, PerQuestionRetriever(), [ex], 1, agent)
    rl = episode_from_trajectory(traj, tok, 3)
    (id1, text1), (id2, text2) = (paragraph(ex, t) for t in ex.metadata["supporting_titles"])
    assert rl.steps == [
        AgentStep("search", play[0], f"Doc 1 {text1}", 3, False, (id1,)),
        AgentStep("invalid", play[1], SEARCH_R1_EXPLANATION, 2),
        AgentStep("search", play[2], f"Doc 1 {text2}", 1, False, (id2,)),
        AgentStep("answer", "<answer> 40 members </answer>", "", 0, True),
    ]
    response = tok.decode(traj.response_ids)
    assert f"<information>Doc 1 {text1}\n\nYou have 2 search(es) remaining." in response


def lengthened(ex, extra: str):
    """``ex`` with both supporting paragraphs followed by ``extra`` (the same titles, so the
    teacher's and the replayed searches still find them)."""
    import copy

    ex = copy.deepcopy(ex)
    for p in ex.metadata["paragraphs"]:
        if p["title"] in ex.metadata["supporting_titles"]:
            p["text"] = f"{p['text']} {extra}"
    return ex


@pytest.mark.parametrize("long", [False, True], ids=["short", "cut"])
def test_warmup_sft_transcript_is_the_agents_own_for_one_play(
    qwen3_tokenizer, teacher_server, tmp_path, long
):
    """With the budget stated every turn (the paper config), π's SFT transcript of the LLM
    teacher's play (``collect_llm``'s trajectory) is, token for token, the one ``run_agent``
    builds for the same play: the prompt with "You have 3 search(es) remaining", each
    observation with the turn's statement between body and tail, the invalid message with it
    too, the same loss mask. With paragraphs longer than ``agent.max_obs_tokens`` (``cut``),
    the teacher's episode holds each paragraph cut where the agent cuts it (the turn's budget
    statement counted against the limit: turn 0 keeps less of it than turn 2, which has none),
    so μ's warmup prompts are RL's."""
    from arco import warmup
    from arco.steps import episode_from_trajectory
    from arco.trainer import make_rubric_items
    from common.rollout import run_agent

    tok = qwen3_tokenizer
    url = teacher_server
    cfg = load_config(
        ArcoConfig,
        ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml",
        [
            f"assets.teacher_endpoint={url}/player/v1",
            f"assets.annotator_endpoint={url}/annotator/v1",
            "warmup.samples=1",
        ],
    )
    ex = load_qa(SAMPLE)[2]
    if long:
        ex = lengthened(ex, long_document().text)
    retriever, agent = build_environment(cfg.env, cfg.agent)
    assert agent.state_budget
    (t,), (warm,), _, _ = warmup.collect_llm(cfg, tok, retriever, agent, [ex], tmp_path / "c")

    play = [s.action for s in warm.steps]
    assert [s.kind for s in warm.steps] == ["search", "invalid", "search", "answer"]
    (traj,) = run_agent(ReplayEngine(tok, play), tok, retriever, [ex], 1, agent)
    assert t.prompt_ids == traj.prompt_ids
    assert "You have 3 search(es) remaining." in tok.decode(t.prompt_ids)
    assert t.response_ids == traj.response_ids
    assert t.loss_mask == traj.loss_mask
    assert [(s.kind, s.start, s.end) for s in t.steps] == [
        (s.kind, s.start, s.end) for s in traj.steps
    ]
    assert t.answer == traj.answer == "40 members"

    rl = episode_from_trajectory(traj, tok, cfg.env.max_searches)
    assert warm.steps == rl.steps
    (_, text1), (_, text2) = (paragraph(ex, x) for x in ex.metadata["supporting_titles"])
    first, second = warm.steps[0].observation, warm.steps[2].observation
    if long:  # cut, the budget statement's room taken from turn 0's paragraph, not turn 2's
        assert len(tok.encode(text1, add_special_tokens=False)) > agent.max_obs_tokens
        assert text1.startswith(first) and len(first) < len(text1)
        assert text2.startswith(second) and len(second) < len(text2)
        frame = len(encode_text(tok, "\nObservation: ") + encode_text(tok, "\nThought:"))
        note = len(encode_text(tok, get_protocol("react").budget_message(2)))
        assert len(encode_text(tok, first)) <= agent.max_obs_tokens - frame - note
        assert len(encode_text(tok, second)) > agent.max_obs_tokens - frame - note
    else:
        assert (first, second) == (text1, text2)
    warm_items = make_rubric_items(cfg, [warm], tok)
    rl_items = make_rubric_items(cfg, [rl], tok)
    assert [it.prompt_ids for it in warm_items] == [it.prompt_ids for it in rl_items]
    assert f"Observation: {second}\n" in tok.decode(warm_items[-1].prompt_ids)
