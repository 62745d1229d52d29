"""`eviback ape` end to end against a real OpenAI-compatible server on loopback whose verdicts are
canned: S with the city when the documents name one, else I; garbage for prompts without titles."""

from __future__ import annotations

import json
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
from common.rollout.trajectory import Step, Trajectory
from eviback.ape import (
    BenchmarkRow,
    candidate_grid,
    label_rollouts,
    read_policy_file,
    write_benchmark,
)
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig
from eviback.oracle import EvidenceOracle
from eviback.prompts import Round, get_prompt

CITIES = ("Paris", "Rome", "Oslo")
WRITTEN = {  # what the canned controller writes when asked for instruction texts
    "A": [
        "Judge only what the documents state. Written one.",
        "Be strict: any gap means insufficient. Written two.",
        "",
    ],
    "B": ["Check the candidate against the documents. Written three."],
}
# What the canned controller proposes for stage A: two grid prompts, one invented name, a stage-B
# prompt, the default again and a repeat (only the first two are kept).
GRID_A = candidate_grid("A")
PROPOSED_A = [GRID_A[5].id, GRID_A[9].id]
CONTROLLER_A = "\n".join(
    [
        PROPOSED_A[0],
        "A-madeup-exact-fs0-q1-t1-rank-m5",
        candidate_grid("B")[1].id,
        GRID_A[0].id,
        PROPOSED_A[1],
        PROPOSED_A[0],
    ]
)


def canned(prompt: str) -> str:
    if prompt.startswith("We tune the stage-A prompt"):
        return CONTROLLER_A
    if prompt.startswith("We tune the stage-B prompt"):
        return "Sorry, I cannot help with naming prompts."
    if prompt.startswith("We tune the instruction"):  # the controller writes instructions
        stage = prompt.split("(stage ", 1)[1][0]
        return "\n".join(f"<instruction>{t}</instruction>" for t in WRITTEN[stage])
    if prompt.startswith("You label evidence"):  # the controller as labeller (NQ rows)
        if "garble" in prompt:
            return "S, I think."
        evidence = prompt.split("Documents:", 1)[-1]
        found = [c for c in CITIES if re.search(rf"\b{c}\b", evidence)]
        status = "supported_answer" if found else "insufficient_evidence"
        return f"<reason>r</reason><status>{status}</status><answer>{''.join(found[:1])}</answer>"
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
        return {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "usage": usage,
        }

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
        out.append(
            BenchmarkRow(
                f"q{i}/0/1",
                f"q{i}",
                f"Where was person {i} born?",
                (city,),
                (Round(f"person {i}", docs),),
                "S" if i % 2 else "I",
                city if i % 2 else "",
            )
        )
    return out


def ape_setup(url: str, tmp_path, *extra: str) -> tuple[Path, EviBackConfig]:
    """The benchmark written into tmp_path/ape and a config judging with the canned teacher."""
    out = tmp_path / "ape"
    out.mkdir()
    write_benchmark(out / "benchmark.jsonl", rows())
    overrides = [
        f"assets.teacher_endpoint={url}",
        "assets.teacher_model=canned",
        f"ape.out={out}",
        "ape.candidates_a=4",
        "ape.candidates_b=2",
        *extra,
    ]
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


def test_ape_shows_its_progress_on_stderr_and_its_lines_on_stdout(teacher_url, tmp_path, capsys):
    """A bar for each pass (stage-A prompts, gated pairs, the holdout runs), with its
    count and rate, on stderr; the estimate and usage lines stay on stdout."""
    url, _ = teacher_url
    out, cfg = ape_setup(url, tmp_path, "ape.gated_from_top=1", "ape.repeats=1")
    from eviback.ape_run import run_ape

    result = run_ape(cfg)
    captured = capsys.readouterr()
    assert "[eviback ape]" in captured.out and "[eviback ape]" not in captured.err
    gated = 1 * 2 * 2 * 2  # top stage-A prompt x 2 stage-B prompts x 2 gates x canonicalise
    chosen = sum(r is not None for r in (result["selection"].single, result["selection"].gated))
    passes = [
        ("APE stage-A prompts", 4, "prompt"),
        ("APE gated pairs", gated, "pair"),
        ("APE holdout", chosen, "policy"),
    ]
    for desc, n, unit in passes:
        assert re.search(rf"{desc}: 100%.*{n}/{n} \[.*({unit}/s|s/{unit})", captured.err), desc


def test_controller_parse_rules():
    from eviback.ape_run import parse_controller_reply

    got = parse_controller_reply(CONTROLLER_A, "A")
    assert [p.id for p in got] == [PROPOSED_A[0], GRID_A[0].id, PROPOSED_A[1]]
    assert parse_controller_reply("nothing useful", "A") == []


def test_ape_with_a_controller_keeps_its_valid_names_and_fills_from_the_grid(teacher_url, tmp_path):
    url, seen = teacher_url
    out, cfg = ape_setup(
        url,
        tmp_path,
        f"assets.controller_endpoint={url}",
        "assets.controller_model=canned-controller",
        "ape.gated_from_top=1",
        "ape.repeats=1",
    )
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


def flashrag_files(tmp_path: Path) -> dict[str, str]:
    """Three questions per source in FlashRAG's layout (fictional people): HotpotQA and 2Wiki
    with columnar supporting facts, MuSiQue with paragraphs, NQ with no supporting facts (its
    third question makes the labeller break the contract)."""
    files = {}
    for source in ("hotpotqa", "2wiki", "musique", "nq"):
        rows = []
        for i in range(3):
            person, city = f"{source} person {i}", CITIES[i]
            row = {
                "id": f"train_{i}",
                "question": f"Where was {person} born?",
                "golden_answers": [city],
                "metadata": {},
            }
            if source in ("hotpotqa", "2wiki"):
                row["metadata"] = {
                    "supporting_facts": {"title": [person, f"{person} family"], "sent_id": [0, 0]}
                }
            elif source == "musique":
                row["metadata"] = {
                    "paragraphs": [
                        {"idx": 0, "title": person, "paragraph_text": "p", "is_supporting": True},
                        {
                            "idx": 1,
                            "title": "elsewhere",
                            "paragraph_text": "q",
                            "is_supporting": False,
                        },
                    ]
                }
            elif i == 2:
                row["question"] = f"Where was {person} born, garble?"
            rows.append(row)
        path = tmp_path / f"{source}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[source] = str(path)
    return files


def flashrag_rollouts(examples) -> list[Trajectory]:
    """Two rollouts a question: one finds both documents (the city named), one only the first."""
    trajs = []
    for ex in examples:
        person, city = ex.question.split(" was ")[1].split(" born")[0], ex.golden_answers[0]
        found = Doc(f"{ex.id}/1", person, f"{person} was born in {city}.", 1.0)
        family = Doc(f"{ex.id}/2", f"{person} family", f"The family of {person}.", 0.9)
        partial = Doc(f"{ex.id}/1", person, f"{person} was born.", 1.0)
        for k, docs in enumerate(([found, family], [partial])):
            steps = [Step("search", 0, 1, query=person, docs=docs), Step("answer", 1, 2)]
            trajs.append(
                Trajectory(
                    ex.id, k, ex.id, ex.question, ex.golden_answers, [1], steps=steps, answer="?"
                )
            )
    return trajs


def test_ape_on_flashrag_format_data(teacher_url, tmp_path):
    """FlashRAG files: HotpotQA / 2Wiki / MuSiQue labelled by the evidence oracle from their
    supporting titles, NQ by the controller LLM (one reply breaks the contract: left out,
    counted); then the whole selection, holdout stratified by step, and the report's lists."""
    from eviback.ape_run import llm_labeller, run_ape
    from eviback.assets import llm_client, load_questions

    url, seen = teacher_url
    examples = load_questions(flashrag_files(tmp_path), {}, 0)
    assert examples[0].metadata["supporting_titles"] == [
        "hotpotqa person 0",
        "hotpotqa person 0 family",
    ]
    assert examples[6].metadata["supporting_titles"] == ["musique person 0"]
    out, cfg = ape_setup(
        url,
        tmp_path,
        f"assets.controller_endpoint={url}",
        "assets.controller_model=canned-c",
        "ape.unlabelled=llm",
        "ape.gated_from_top=1",
        "ape.repeats=1",
    )
    client = llm_client(url, "canned-c", cfg.teacher, None)
    by_id = {ex.id: ex for ex in examples}
    rows, counts = label_rollouts(
        flashrag_rollouts(examples), by_id, EvidenceOracle(5).label, llm_labeller(client)
    )
    labels = {r.row_id: (r.label, r.label_answer) for r in rows}
    # both supporting documents: S; one missing: I (MuSiQue needs one, but the city is gone:
    # the oracle reads titles only, so S)
    assert labels["hotpotqa:train_0/0/1"] == ("S", "Paris")
    assert labels["hotpotqa:train_0/1/1"] == ("I", "")
    assert labels["musique:train_1/1/1"] == ("S", "Rome")
    assert labels["nq:train_1/0/1"] == ("S", "Rome") and labels["nq:train_1/1/1"] == ("I", "")
    assert "nq:train_2/0/1" not in labels  # the labeller broke the contract
    assert counts == {
        "questions_oracle": 9,
        "questions_without_facts": 3,
        "rows_oracle": 18,
        "rows_llm": 4,
        "rows_llm_invalid": 2,
        "questions_left_out": 0,
    }
    assert any(p.startswith("You label evidence") for p in seen)
    write_benchmark(out / "benchmark.jsonl", rows)
    (out / "benchmark_counts.json").write_text(json.dumps(counts))
    result = run_ape(cfg)
    report = (out / "report.md").read_text()
    assert (
        "18 rows of 9 questions by the evidence oracle; 3 questions without supporting " in report
    )
    assert "4 rows labelled by the controller LLM (2 replies broke the contract" in report
    assert "holdout split: step" in report
    assert "Confusion (rows: gold label" in report and "Missed I (" in report
    policy, scores = read_policy_file(out / "policy.yaml")
    assert policy == result["selection"].best.policy
    assert scores["dev_rows"] + scores["holdout_rows"] == 22


def test_ape_llm_labelling_needs_a_controller(tmp_path):
    from eviback.ape_run import run_ape

    cfg = load_config(
        EviBackConfig,
        DEFAULT_CONFIG,
        [
            f"ape.out={tmp_path}",
            "assets.teacher_endpoint=http://127.0.0.1:9/v1",
            "assets.teacher_model=t",
            "ape.unlabelled=llm",
        ],
    )
    with pytest.raises(ValueError, match="assets.controller_endpoint"):
        run_ape(cfg)


def test_ape_with_controller_written_instructions(teacher_url, tmp_path):
    """The controller writes instruction texts; they are judged beside the grid's prompts, named
    in the report, and a frozen policy that uses one carries its text."""
    from eviback.ape_run import controller_written, run_ape
    from eviback.assets import llm_client
    from eviback.prompts import INSTRUCTIONS, register_instruction

    url, _ = teacher_url
    out, cfg = ape_setup(
        url,
        tmp_path,
        f"assets.controller_endpoint={url}",
        "assets.controller_model=writer",
        "ape.gated_from_top=1",
        "ape.repeats=1",
        "ape.written_a=3",
        "ape.written_b=1",
    )
    client = llm_client(url, "writer", cfg.teacher, None)
    written = controller_written(client, "A", 3)
    assert [INSTRUCTIONS["A"][p.instruction] for p in written] == WRITTEN["A"][:2]  # "" dropped
    assert all(p.instruction.startswith("ctl_") and p.show_titles for p in written)
    assert written[0].instruction == register_instruction("A", WRITTEN["A"][0])  # stable name
    assert get_prompt(written[0].id) == written[0]
    run_ape(cfg)
    report = (out / "report.md").read_text()
    assert "+ 2 written by the controller; stage B" in report
    assert "## Instructions written by the controller" in report
    for p in written:
        assert p.id in report  # judged on dev
    policy, _ = read_policy_file(out / "policy.yaml")
    assert get_prompt(policy.stage_a).show_titles


def test_ape_questions_come_from_every_source(tmp_path):
    """A seeded draw over the training set (not the first rows of the first file, which at paper
    scale would all be NQ's)."""
    from eviback.ape_run import ape_questions

    files = flashrag_files(tmp_path)
    cfg = load_config(
        EviBackConfig,
        DEFAULT_CONFIG,
        [
            f"assets.train={{{', '.join(f'{k}: {v}' for k, v in files.items())}}}",
            "ape.questions=8",
        ],
    )
    got = ape_questions(cfg)
    assert len(got) == 8 == len({ex.id for ex in got})
    assert len({ex.id.split(":")[0] for ex in got}) >= 3  # 8 of 12, at most 3 per source
    assert [ex.id for ex in got] == [ex.id for ex in ape_questions(cfg)]
    cfg.ape.questions = 50
    assert len(ape_questions(cfg)) == 12
