"""ARCO's warmup with the LLM teacher, end to end in the distractor setting: real HotpotQA rows,
the tiny world's backbone, and a scripted OpenAI-compatible server (FastAPI + uvicorn) on
loopback playing the policy on one endpoint and the hindsight annotator on another."""

from __future__ import annotations

import functools
import json
import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from loopback_server import serve

from arco import warmup
from arco.cli import main
from arco.config import ArcoConfig
from arco.environment import build_environment
from arco.steps import AgentStep, Episode
from common.config import load_config
from common.data import load_qa
from common.llm_client import LLMClient
from common.retrieval.base import Doc
from common.rollout import run_agent
from common.rollout.agent import render_observation
from common.rollout.engine import Completion
from common.rollout.protocols import get_protocol

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
SAMPLE = ROOT / "tests" / "data" / "retrieval" / "hotpotqa_distractor_sample.jsonl"
ROWS = load_qa(SAMPLE)
ROW_OF = {ex.question.strip(): i for i, ex in enumerate(ROWS)}
MAX_SEARCHES, K = 3, 3

# The seed-0 shuffle plays rows 4 1 5 2 0 3 and keeps 7 6 to choose π's epoch.
PLAYED = [4, 1, 5, 2, 0, 3]
ROLES = {4: "right", 1: "right", 5: "wrong", 2: "wander", 0: "guess", 3: "wrong"}
MALFORMED, FAILING = (5, 0), (1, 1)  # (row, sample) whose annotation is broken / a 500


def player_reply(row: int, turn: int, sample: int) -> str:
    """right: search a supporting title, then the gold answer; wrong: the same search, then a
    wrong answer; guess: the gold answer at once; wander: search, an invalid turn, the other
    supporting title, then the gold answer on the forced turn. Sample 0 thinks aloud first."""
    ex = ROWS[row]
    gold, (first_title, second_title) = ex.golden_answers[0], ex.metadata["supporting_titles"]
    search = f"Action: Search[{first_title}]"
    if sample == 0:
        search = f"Thought: I should look up {first_title}.\n{search}"
    script = {
        "right": [search, f"Thought: The paragraph says it.\nAction: Finish[{gold}]"],
        "wrong": [search, "Action: Finish[Atlantis]"],
        "guess": [f"Action: Finish[{gold}]"],
        "wander": [
            search,
            "I am not sure what to do.",
            f"Action: Search[{second_title}]",
            f"Action: Finish[{gold}]",
        ],
    }[ROLES[row]]
    return script[turn]


def annotator_reply(row: int, sample: int, n_steps: int) -> str | None:
    """K criteria and scores per step (off the constraint, one out of range: the projection fixes
    both); truncated JSON for MALFORMED; None (HTTP 500) for FAILING."""
    if (row, sample) == FAILING:
        return None
    if (row, sample) == MALFORMED:
        return '[{"step": 1, "criteria": ["a", "b", "c"], "scores": [0.3, 0.1, 0.0]'
    steps = [
        {
            "step": t,
            "criteria": [f"criterion {j} of step {t}" for j in range(1, K + 1)],
            "scores": [1.4, 0.2, -0.3 * t],
        }
        for t in range(1, n_steps + 1)
    ]
    return "Here is the annotation:\n```json\n" + json.dumps(steps) + "\n```"


@dataclass
class ServerState:
    requests: Counter = field(default_factory=Counter)  # role -> HTTP requests
    prompt_tokens: Counter = field(default_factory=Counter)  # role -> tokens of answered ones
    completion_tokens: Counter = field(default_factory=Counter)
    asked: list[tuple[str, int, int]] = field(default_factory=list)  # (role, row, sample)
    seen: Counter = field(default_factory=Counter)  # player prompt -> times asked
    probed: Counter = field(default_factory=Counter)  # role -> GET /models before the warmup


def make_app(state: ServerState) -> FastAPI:
    app = FastAPI()

    @app.post("/{role}/v1/chat/completions")
    async def chat(role: str, request: Request):
        body = await request.json()
        user = body["messages"][1]["content"]
        row = ROW_OF[re.search(r"^Question: (.*)$", user, re.M).group(1).strip()]
        if role == "player":
            left = int(re.search(r"^Searches remaining: (\d+)$", user, re.M).group(1))
            turn = MAX_SEARCHES - left
            # samples go out one after the other: the first to ask a first turn is sample 0
            sample = state.seen[user] if turn == 0 else int("I should look up" not in user)
            state.seen[user] += 1
            text = player_reply(row, turn, sample)
        else:
            sample = int("Action: Thought: I should look up" not in user)
            n_steps = len(re.findall(r"^Step \d+ \|", user, re.M))
            text = annotator_reply(row, sample, n_steps)
        state.requests[role] += 1
        state.asked.append((role, row, sample))
        if text is None:
            return JSONResponse({"error": "boom"}, status_code=500)
        state.prompt_tokens[role] += len(user.split())
        state.completion_tokens[role] += len(text.split())
        usage = {"prompt_tokens": len(user.split()), "completion_tokens": len(text.split())}
        message = {"role": "assistant", "content": text}
        return {"choices": [{"index": 0, "message": message}], "usage": usage}

    @app.get("/{role}/v1/models")
    async def models(role: str):  # the warmup's probe: each endpoint serves its role's model
        state.probed[role] += 1
        return {"object": "list", "data": [{"id": role, "object": "model"}]}

    return app


@pytest.fixture
def teacher_server():
    state = ServerState()
    # connections stay open across a slow test's pauses: a request never meets one closing
    with serve(make_app(state), timeout_keep_alive=600) as port:
        yield state, f"http://127.0.0.1:{port}"


def overrides(world: Path, out: Path, url: str) -> list[str]:
    return [
        f"assets.model={world / 'model'}",
        f"assets.train={SAMPLE}",
        f"assets.teacher_endpoint={url}/player/v1",
        "assets.teacher_model=player",
        f"assets.annotator_endpoint={url}/annotator/v1",
        "assets.annotator_model=annotator",
        f"warmup_dir={out}",
        f"warmup.api_cache_dir={out.parent / 'llm_cache'}",
        "env.setting=distractor",
        f"env.max_searches={MAX_SEARCHES}",
        "agent.instruction=''",  # the ReAct protocol's own prompt
        "engine.backend=hf",
        "lora.r=4",
        "lora.lora_alpha=8",
        f"rubric.k={K}",
        "warmup.teacher=llm",
        "warmup.questions=6",
        "warmup.select_questions=2",
        "warmup.samples=2",
        "warmup.pi_epochs=1",
        "warmup.mu_epochs=1",
        "warmup.pi_batch=4",
        "warmup.mu_batch=8",
    ]


def episode_of(row: dict) -> Episode:
    steps = [AgentStep(**{**s, "doc_ids": tuple(s["doc_ids"])}) for s in row["steps"]]
    keys = ("question_id", "question", "golden_answers", "answer", "reward", "metadata")
    return Episode(steps=steps, **{k: row[k] for k in keys})


class ReplayEngine:
    """Plays given turns as the policy's samples, one trajectory at a time."""

    def __init__(self, tokenizer, actions: list[str]):
        self.tokenizer = tokenizer
        self.turns = [tokenizer.encode(a, add_special_tokens=False) for a in actions]

    def generate(self, prompts, params, adapter=None):
        (ids,) = [self.turns.pop(0) for _ in prompts]
        text = self.tokenizer.decode(ids)
        return [[Completion(ids, [0.0] * len(ids), text, "stop" if "]" in text else "length")]]


@pytest.mark.slow
def test_llm_teacher_warmup_in_the_distractor_setting(
    tiny_world, tmp_path, teacher_server, monkeypatch, capsys
):
    from transformers import AutoTokenizer

    state, url = teacher_server
    # the 500's retries back off for milliseconds, not seconds
    monkeypatch.setattr(warmup, "LLMClient", functools.partial(LLMClient, backoff=0.01))
    out = tmp_path / "warmup"
    cfg = load_config(ArcoConfig, CONFIG, overrides(tiny_world, out, url))
    assert warmup.run_warmup(cfg) == out
    assert state.probed == Counter({"player": 1, "annotator": 1})  # probed once, before the play
    assert "π SFT on 5, μ SFT on 8" in capsys.readouterr().out  # one R = 1 episode lost its notes

    for name in ("policy", "rubric", "policy_ref", "rubric_ref"):
        assert (out / "adapters" / name / "adapter_model.safetensors").is_file()
    assert (out / "rubric_head" / "head.safetensors").is_file()
    assert json.loads((out / "arco.json").read_text())["k"] == K

    # --- what the server saw and what the report counts
    steps_per_role = {"right": 2, "wrong": 2, "guess": 1, "wander": 4}
    player_requests = sum(2 * steps_per_role[ROLES[r]] for r in PLAYED)
    assert {row for _, row, _ in state.asked} == set(PLAYED)
    # the guess row's two samples are one play: their annotation request goes out once; the
    # 500 is 1 + 3 retries
    assert state.requests == {"player": player_requests, "annotator": 10 + 4}
    report = json.loads((out / "report.json").read_text())
    counts = report["counts"]
    assert {k: v for k, v in counts.items() if not k.endswith("_usage")} == {
        "finished": 12,
        "correct": 8,  # right, wander and guess, both samples
        "request_failed": 0,
        "invalid_steps": 2,
        "forced_searches": 0,
        "annotation/ok": 10,
        "annotation/unparseable": 1,
        "annotation/wrong_step_count": 0,
        "annotation/wrong_k": 0,
        "annotation/request_failed": 1,
    }
    player, annotator = counts["player_usage"], counts["annotator_usage"]
    assert player["calls"] == player["requests"] == player_requests
    assert player["cache_hits"] == player["failures"] == 0
    assert (annotator["calls"], annotator["requests"], annotator["failures"]) == (12, 14, 1)
    assert annotator["cache_hits"] == 1  # the guess row's second sample
    for usage, role in ((player, "player"), (annotator, "annotator")):
        assert usage["prompt_tokens"] == state.prompt_tokens[role] > 0
        assert usage["completion_tokens"] == state.completion_tokens[role] > 0
    assert report["filter"] == {"dropped": 2, "one_step": 2, "decomposition_fails": 0}

    # --- the annotated episodes
    rows = [json.loads(line) for line in (out / "data.jsonl").open()]
    assert [(r["question_id"], r["metadata"]["sample"]) for r in rows] == [
        (ROWS[i].id, s) for i in PLAYED for s in (0, 1)
    ]
    for played, r in zip([(i, s) for i in PLAYED for s in (0, 1)], rows, strict=True):
        if played in (MALFORMED, FAILING):
            assert r["annotation"] is None
            continue
        ann = r["annotation"]
        assert len(ann) == len(r["steps"])
        assert all(len(a["criteria"]) == K and len(a["scores"]) == K for a in ann)
        assert all(-1.0 <= x <= 1.0 for a in ann for x in a["scores"])
        total = sum(sum(a["scores"]) / K for a in ann)
        assert total == pytest.approx(r["reward"], abs=1e-6)
    episodes = [episode_of(r) for r in rows]
    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "model")
    retriever, agent = build_environment(cfg.env, cfg.agent)
    protocol = get_protocol(agent.protocol)
    searches, cut = 0, 0
    for ep in episodes:
        paragraphs = ep.metadata["paragraphs"]
        for step in ep.steps:
            if step.kind != "search":
                continue
            searches += 1
            (doc,) = step.doc_ids
            paragraph = paragraphs[int(doc)]
            assert step.action.endswith(f"Search[{paragraph['title']}]")  # found its title
            # the text without its title, cut where the agent cuts it (agent.max_obs_tokens)
            shown = render_observation(
                tokenizer,
                protocol,
                [Doc(doc, paragraph["title"], paragraph["text"], 0.0)],
                agent.max_obs_tokens,
                agent.obs_titles,
            )[2]
            assert step.observation == shown.strip()
            assert paragraph["text"].startswith(step.observation)
            cut += step.observation != paragraph["text"]
    assert searches == 4 + 4 + 4  # right and wrong: one an episode; wander: two; guess: none
    assert 0 < cut < searches  # the tiny world's limit cuts some paragraphs, not all

    # --- π SFT on R = 1 trajectories with > 1 step; their token view is the policy's own
    assert [e["epoch"] for e in report["pi_sft"]["epochs"]] == [0, 1]
    assert report["pi_sft"]["epochs"][1]["loss"] > 0
    assert len(report["mu_sft"]["epochs"]) == 1
    wins = [e for e in episodes if e.reward == 1.0 and len(e.steps) > 1]
    assert len(wins) == 6
    for ep in wins:
        t = warmup.trajectory_from_episode(ep, tokenizer, agent)
        sampled = set()
        for step, span in zip(ep.steps, t.steps, strict=True):
            assert t.response_ids[span.start : span.end] == tokenizer.encode(
                step.action, add_special_tokens=False
            )
            sampled |= set(range(span.start, span.end))
        assert {i for i, m in enumerate(t.loss_mask) if m} == sampled
        assert len(t.loss_mask) == len(t.response_ids)
        if ROLES[ROW_OF[ep.question.strip()]] == "wander":  # invalid turn, forced turn
            text = tokenizer.decode(t.response_ids)
            assert protocol.invalid_message() in text and protocol.force_answer_message() in text
        (ex,) = [x for x in ROWS if x.id == ep.question_id]
        engine = ReplayEngine(tokenizer, [s.action for s in ep.steps])
        (own,) = run_agent(engine, tokenizer, retriever, [ex], 1, agent)
        assert (own.prompt_ids, own.response_ids) == (t.prompt_ids, t.response_ids)
        assert own.loss_mask == t.loss_mask
        assert [(s.start, s.end) for s in own.steps] == [(s.start, s.end) for s in t.steps]

    # --- a rerun with the same settings finds every phase done (warmup_dir/phases): no request
    before = Counter(state.requests)
    asked = len(state.asked)
    first_data = (out / "data.jsonl").read_text()
    capsys.readouterr()
    warmup.run_warmup(load_config(ArcoConfig, CONFIG, overrides(tiny_world, out, url)))
    assert Counter(state.requests) == before
    assert f"μ phase done at {out}, skipped" in capsys.readouterr().out
    # --- the phases' markers removed, a run replays the teacher from the cache; only the
    # failed request goes out again
    shutil.rmtree(out / "phases")
    warmup.run_warmup(load_config(ArcoConfig, CONFIG, overrides(tiny_world, out, url)))
    assert state.requests - before == {"annotator": 4}
    assert set(state.asked[asked:]) == {("annotator", *FAILING)}
    again = json.loads((out / "report.json").read_text())["counts"]
    assert again["player_usage"]["cache_hits"] == player_requests
    assert again["player_usage"]["requests"] == 0
    assert (again["annotator_usage"]["cache_hits"], again["annotator_usage"]["requests"]) == (11, 4)
    assert (out / "data.jsonl").read_text() == first_data


def test_llm_teacher_without_endpoint_stops_before_any_model_loads(
    tiny_world, tmp_path, capsys, monkeypatch
):
    def no_load(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(warmup, "build_arco_model", no_load)
    code = main(
        [
            "warmup",
            "--config",
            str(CONFIG),
            f"assets.train={SAMPLE}",
            "env.setting=distractor",
            "warmup.teacher=llm",
            "assets.teacher_endpoint=''",
            "assets.teacher_model=player",
            "assets.annotator_endpoint=http://127.0.0.1:9/v1",
            "assets.annotator_model=annotator",
            f"warmup_dir={tmp_path / 'w'}",
            f"assets.model={tiny_world / 'model'}",  # a hub id would be looked up on the hub
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "assets.teacher_endpoint is empty" in err and "OpenAI-compatible" in err
    assert err.count("assets.") == err.count("assets.teacher_endpoint")  # nothing else missing
    assert not (tmp_path / "w").exists()


def test_a_wrong_model_name_stops_the_warmup_before_any_model_loads(
    tiny_world, tmp_path, teacher_server, monkeypatch
):
    from common.launcher import RunStopped

    state, url = teacher_server

    def no_load(*a, **k):
        raise AssertionError("a model loaded before the endpoints were probed")

    monkeypatch.setattr(warmup, "build_arco_model", no_load)
    wrong = [*overrides(tiny_world, tmp_path / "warmup", url), "assets.annotator_model=gpt-5.4"]
    cfg = load_config(ArcoConfig, CONFIG, wrong)
    with pytest.raises(RunStopped, match=r"serves \['annotator'\], not 'gpt-5.4'"):
        warmup.run_warmup(cfg)
    assert sum(state.requests.values()) == 0
