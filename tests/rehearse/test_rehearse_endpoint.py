"""The stand-in LLM endpoint against the project's real clients over a real loopback server:
EviBack's two-stage teacher and E2E-APE's controller, ARCO's warmup player and annotator."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from arco.steps import AgentStep, Episode
from arco.teacher import (
    annotate,
    annotation_messages,
    teacher_policy_messages,
    teacher_rollouts,
)
from common.data import QAExample
from common.llm_client import LLMClient
from common.retrieval.base import Doc
from eviback.ape import labeller_messages
from eviback.ape_run import controller_candidates, controller_written, llm_labeller
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round
from eviback.teacher import TeacherItem, TeacherPolicy, TwoStageTeacher
from experiments.rehearse.endpoint import (
    CONTRACTS,
    FAILURES,
    Shares,
    StandinEndpoint,
    recognise,
    serve_endpoint,
)

PARIS = Doc("d1", "Mira Kovalenko", "Mira Kovalenko was born in Paris.", 1.0)
BOTH = Doc("d2", "Vera Lind", "Vera Lind sang in Paris in 1912.", 0.9)
NOTHING = Doc("d3", "Harbour Lights", "Harbour Lights is a film.", 0.8)
POLICY = TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id)


def item(docs, refs=("Paris",)) -> TeacherItem:
    return TeacherItem("Where was the director born?", [Round("director", tuple(docs))], refs)


def client(url: str, **kw) -> LLMClient:
    return LLMClient(url, "standin-model", retries=1, backoff=0.01, **kw)


def stats(url: str) -> dict:
    return httpx.get(url.removesuffix("/v1") + "/stats").json()


# The glass orchard world, searched by exact query (a test's retrieval, hand-written answers).
QUESTION = "Where was the director of film The Glass Orchard born?"
PAGES = {
    QUESTION: "The Glass Orchard is a 1962 drama film. It was directed by Mira Kovalenko.",
    "Mira Kovalenko": "Mira Kovalenko was born in Paris.",
}
EXAMPLE = QAExample("q1", QUESTION, ["Paris"])


def search(ex: QAExample, query: str) -> tuple[str, tuple[str, ...]]:
    return PAGES.get(query, "No such page."), (query,)


EPISODE = Episode(
    "q1",
    QUESTION,
    ["Paris"],
    [
        AgentStep("search", "Action: Search[x]", "obs", 3),
        AgentStep("answer", "Action: Finish[Paris]", "", 2),
    ],
    "Paris",
    1.0,
)


@pytest.fixture(scope="module")
def url():
    with serve_endpoint(seed=0) as base:
        yield base


def test_markers_recognise_each_clients_prompt():
    rounds = [Round("director", (PARIS,))]
    ref_item = item([PARIS])
    cases = {
        "eviback_stage_a": STAGE_A_DEFAULT.messages("Q?", rounds),
        "eviback_stage_b": STAGE_B_DEFAULT.messages("Q?", rounds, ["Paris"]),
        "eviback_labeller": labeller_messages(ref_item),
        "arco_player": teacher_policy_messages(QUESTION, [], 3),
        "arco_annotator": annotation_messages(EPISODE, 3),
    }
    for contract, messages in cases.items():
        assert recognise(messages) == contract
    assert set(CONTRACTS) == {*cases, "ape_controller", "ape_writer"}
    with pytest.raises(ValueError, match="no known contract's prompt text.*'Hello there'"):
        recognise([{"role": "user", "content": "Hello there"}])


def test_eviback_teacher_verdicts_parse_and_merge(url):
    teacher = TwoStageTeacher(client(url), POLICY)
    items = [item([PARIS]), item([NOTHING]), item([BOTH], refs=("1912",))]
    judgements, st = teacher.judge(items)
    assert [(j.stage_a.status, j.stage_a.answer) for j in judgements] == [
        ("S", "Paris"),
        ("I", ""),
        ("A", ""),
    ]
    assert [(j.final.status, j.final.answer) for j in judgements] == [
        ("S", "Paris"),
        ("I", ""),
        ("S", "1912"),  # A ambiguous, B supports the candidate: merge rule 5 takes B
    ]
    assert (st.calls_a, st.calls_b, st.failures, st.invalid_a, st.invalid_b) == (3, 2, 0, 0, 0)
    s = stats(url)["by_contract"]
    assert s["eviback_stage_a"]["ok"] >= 3 and s["eviback_stage_b"]["ok"] >= 2


def test_ape_controller_proposals_writer_and_labeller(url):
    c = client(url)
    prompts_a, from_a = controller_candidates(c, "A", 5)
    prompts_b, from_b = controller_candidates(c, "B", 3)
    assert (len(prompts_a), from_a, len(prompts_b), from_b) == (5, 4, 3, 2)
    assert prompts_a[0] == STAGE_A_DEFAULT and len(set(prompts_a)) == 5
    assert all(p.stage == "B" and not p.show_queries for p in prompts_b)
    written = controller_written(c, "A", 2)
    assert len(written) == 2 and all(p.instruction.startswith("ctl_") for p in written)
    # a written instruction's prompt is still recognised and judged
    judgements, _ = TwoStageTeacher(c, TeacherPolicy(written[0].id)).judge([item([PARIS])])
    assert (judgements[0].final.status, judgements[0].final.answer) == ("S", "Paris")
    verdicts = llm_labeller(c)([item([PARIS]), item([NOTHING])])
    assert [(v.valid, v.status, v.answer) for v in verdicts] == [
        (True, "S", "Paris"),
        (True, "I", ""),
    ]


def test_arco_player_and_annotator(url):
    c = client(url)
    episodes, counts = teacher_rollouts(c, [EXAMPLE], search, samples=1, max_searches=3)
    assert counts["finished"] == 1 and counts["correct"] == 1 and counts["invalid_steps"] == 0
    ep = episodes[0]
    assert [(s.kind, s.action.rsplit("Action: ", 1)[-1]) for s in ep.steps] == [
        ("search", f"Search[{QUESTION}]"),
        ("search", "Search[Mira Kovalenko]"),
        ("answer", "Finish[Paris]"),
    ]
    assert (ep.answer, ep.reward) == ("Paris", 1.0)
    result = annotate(c, episodes, k=3)
    assert result.counts["ok"] == 1
    steps = result.annotations[0]
    assert len(steps) == 3 and all(len(s.criteria) == len(s.scores) == 3 for s in steps)
    assert sum(sum(s.scores) / 3 for s in steps) == pytest.approx(1.0)  # step means add up to R


def test_models_and_unrecognised_request(url):
    before = stats(url)["by_contract"]["unrecognised"]["http_400"]
    response = httpx.post(
        f"{url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert response.status_code == 400
    assert "cannot recognise the request" in response.json()["error"]["message"]
    assert httpx.post(f"{url}/chat/completions", content=b"{not json").status_code == 400
    result = client(url).chat([{"role": "user", "content": "Hi"}])
    assert result.text is None and "HTTP 400" in result.error  # not retried
    assert stats(url)["by_contract"]["unrecognised"]["http_400"] == before + 3
    models = httpx.get(f"{url}/models").json()["data"]
    assert {"standin", "standin-model"} <= {m["id"] for m in models}


@pytest.mark.parametrize("kind", FAILURES)
def test_each_failure_kind_gives_the_clients_counted_fallback(kind):
    retried = kind != "malformed"  # a body without choices is retried too; a broken contract not
    attempts = 2 if retried else 1  # retries=1
    with serve_endpoint(**{kind: 1.0}, seed=3, timeout_delay_s=1.0) as url:
        kw = {"timeout": 0.3}
        judgements, st = TwoStageTeacher(client(url, **kw), POLICY).judge([item([PARIS])])
        assert not judgements[0].final.valid and st.calls_b == 0
        assert (st.failures, st.invalid_a) == ((0, 1) if kind == "malformed" else (1, 1))

        episodes, counts = teacher_rollouts(client(url, **kw), [EXAMPLE], search, 1, 3)
        if kind == "malformed":  # four invalid turns, the forced one too: R = 0
            assert counts["invalid_steps"] == 4 and episodes[0].reward == 0.0
        else:
            assert counts["request_failed"] == 1 and episodes == []

        result = annotate(client(url, **kw), [EPISODE], k=3)
        assert result.annotations == [None]
        assert result.counts["unparseable" if kind == "malformed" else "request_failed"] == 1

        prompts, from_controller = controller_candidates(client(url, **kw), "A", 4)
        assert (len(prompts), from_controller) == (4, 0)  # filled from the grid

        # HTTP requests: one call each, the player one a turn (four when its turns go on)
        calls = {"eviback_stage_a": 1, "arco_player": 4 if kind == "malformed" else 1,
                 "arco_annotator": 1, "ape_controller": 1}  # fmt: skip
        s = stats(url)
        for contract, n in calls.items():
            assert s["by_contract"][contract][kind] == n * attempts, contract
            assert s["by_contract"][contract]["ok"] == 0, contract
        assert s["requests"] == s["by_outcome"][kind] == sum(calls.values()) * attempts


def test_shares_are_checked_and_drawn():
    with pytest.raises(ValueError, match="share timeout=1.5"):
        Shares(timeout=1.5)
    with pytest.raises(ValueError, match="add up to 1.2"):
        Shares(malformed=0.6, http_500=0.6)
    s = Shares(malformed=0.2, http_503=0.3)
    assert [s.draw(u) for u in (0.0, 0.19, 0.2, 0.49, 0.5, 0.99)] == [
        "malformed", "malformed", "http_503", "http_503", "ok", "ok",
    ]  # fmt: skip
    a, b = (
        StandinEndpoint(Shares(malformed=0.5), seed=7),
        StandinEndpoint(Shares(malformed=0.5), seed=7),
    )
    bodies = [{"messages": [{"content": str(i)}]} for i in range(200)]
    drawn = [a._outcome(x) for x in bodies]
    assert drawn == [b._outcome(x) for x in bodies]  # seeded by body, not by arrival order
    assert 70 < drawn.count("malformed") < 130


def test_cli_serves(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "experiments.rehearse.endpoint",
            "--port",
            str(port),
            "--malformed",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 30
        while True:
            try:
                s = httpx.get(f"http://127.0.0.1:{port}/stats").json()
                break
            except httpx.TransportError:
                assert time.time() < deadline and proc.poll() is None, "endpoint CLI did not start"
                time.sleep(0.1)
        assert s["shares"]["malformed"] == 1.0 and s["requests"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
