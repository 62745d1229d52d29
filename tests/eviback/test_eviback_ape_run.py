"""`eviback ape` end to end against a real OpenAI-compatible server on loopback whose verdicts are
canned: S with the city when the documents name one, else I; garbage for prompts without titles."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request

from common.config import load_config
from common.retrieval.base import Doc
from eviback.ape import BenchmarkRow, candidate_grid, read_policy_file, write_benchmark
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig
from eviback.prompts import Round, get_prompt

CITIES = ("Paris", "Rome", "Oslo")
# What the canned controller proposes for stage A: two grid prompts, one invented name, a stage-B
# prompt, the default again and a repeat (only the first two are kept).
GRID_A = candidate_grid("A")
PROPOSED_A = [GRID_A[5].id, GRID_A[9].id]
CONTROLLER_A = "\n".join(
    [PROPOSED_A[0], "A-madeup-exact-fs0-q1-t1-rank-m5", candidate_grid("B")[1].id,
     GRID_A[0].id, PROPOSED_A[1], PROPOSED_A[0]]
)  # fmt: skip


def canned(prompt: str) -> str:
    if prompt.startswith("We tune the stage-A prompt"):
        return CONTROLLER_A
    if prompt.startswith("We tune the stage-B prompt"):
        return "Sorry, I cannot help with naming prompts."
    if "(Title: " not in prompt:  # prompts hiding titles: the teacher rambles
        return "I think the answer is probably Paris."
    evidence = prompt.split("Documents:", 1)[-1]
    found = [c for c in CITIES if re.search(rf"\b{c}\b", evidence)]
    if found:
        return f"<reason>named</reason><status>supported_answer</status><answer>{found[0]}</answer>"
    return "<reason>none</reason><status>insufficient_evidence</status><answer></answer>"


@pytest.fixture(scope="module")
def teacher_url():
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        prompt = (await request.json())["messages"][-1]["content"]
        seen.append(prompt)
        text = canned(prompt)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                "usage": usage}  # fmt: skip

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not srv.started:
        assert time.time() < deadline
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", seen
    srv.should_exit = True
    thread.join(timeout=5)
    sock.close()


def rows() -> list[BenchmarkRow]:
    """12 questions: evidence with the answer city (label S) or without (label I)."""
    out = []
    for i in range(12):
        city = CITIES[i % 3]
        text = f"Person {i} was born in {city}." if i % 2 else f"Person {i} was born somewhere."
        docs = (Doc(f"d{i}", f"Person {i}", text, 1.0),)
        out.append(BenchmarkRow(f"q{i}/0/1", f"q{i}", f"Where was person {i} born?", (city,),
                                (Round(f"person {i}", docs),), "S" if i % 2 else "I",
                                city if i % 2 else ""))  # fmt: skip
    return out


def ape_setup(url: str, tmp_path, *extra: str) -> tuple[Path, EviBackConfig]:
    """The benchmark written into tmp_path/ape and a config judging with the canned teacher."""
    out = tmp_path / "ape"
    out.mkdir()
    write_benchmark(out / "benchmark.jsonl", rows())
    overrides = [f"assets.teacher_endpoint={url}", "assets.teacher_model=canned",
                 f"ape.out={out}", "ape.candidates_a=4", "ape.candidates_b=2", *extra]  # fmt: skip
    return out, load_config(EviBackConfig, DEFAULT_CONFIG, overrides)


def test_ape_selects_writes_policy_and_report(teacher_url, tmp_path):
    url, seen = teacher_url
    out, cfg = ape_setup(url, tmp_path, "ape.gated_from_top=2", "ape.repeats=2")
    from eviback.ape_run import run_ape

    result = run_ape(cfg)
    policy, scores = read_policy_file(out / "policy.yaml")
    assert scores["dev"]["objective_mean"] == 1.0 and scores["holdout"]["objective_mean"] == 1.0
    assert scores["dev"]["parse_rate"] == 1.0
    assert get_prompt(policy.stage_a).show_titles  # the rambling prompts lose
    assert "-t0-" in (out / "report.md").read_text()  # ... and were among the candidates
    assert policy == result["selection"].best.policy
    assert scores["dev_rows"] + scores["holdout_rows"] == 12
    report = (out / "report.md").read_text()
    assert "## Dev" in report and "## Holdout" in report and policy.strategy_id in report
    assert len(seen) > 0


def test_controller_parse_rules():
    from eviback.ape_run import parse_controller_reply

    got = parse_controller_reply(CONTROLLER_A, "A")
    assert [p.id for p in got] == [PROPOSED_A[0], GRID_A[0].id, PROPOSED_A[1]]
    assert parse_controller_reply("nothing useful", "A") == []


def test_ape_with_a_controller_keeps_its_valid_names_and_fills_from_the_grid(teacher_url, tmp_path):
    url, seen = teacher_url
    out, cfg = ape_setup(
        url, tmp_path, f"assets.controller_endpoint={url}",
        "assets.controller_model=canned-controller", "ape.gated_from_top=1", "ape.repeats=1",
    )  # fmt: skip
    from eviback.ape_run import controller_candidates, run_ape
    from eviback.assets import llm_client

    client = llm_client(url, "canned-controller", cfg.teacher, None)
    prompts, n = controller_candidates(client, "A", 4)
    # the default, the controller's two valid names, then one grid prompt to make four
    assert [p.id for p in prompts[:3]] == [GRID_A[0].id, *PROPOSED_A] and n == 2
    assert len(prompts) == 4 and prompts[3] in GRID_A
    prompts, n = controller_candidates(client, "B", 2)  # a useless reply: default + grid
    assert n == 0 and len(prompts) == 2

    run_ape(cfg)
    report = (out / "report.md").read_text()
    assert (
        "controller canned-controller (stage A: 2 proposed + the default + 1 from the grid"
        in report
    )
    for name in PROPOSED_A:
        assert name in report  # evaluated on dev
    assert any(p.startswith("We tune the stage-A prompt") for p in seen)
    policy, _ = read_policy_file(out / "policy.yaml")
    assert get_prompt(policy.stage_a).show_titles


def test_ape_without_a_teacher_endpoint_says_so(tmp_path):
    cfg = load_config(EviBackConfig, DEFAULT_CONFIG, [f"ape.out={tmp_path}"])
    from eviback.ape_run import run_ape

    with pytest.raises(ValueError, match="assets.teacher_endpoint"):
        run_ape(cfg)
