"""LLMClient against a real OpenAI-compatible HTTP server (FastAPI + uvicorn) on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from loopback_server import serve

from common.llm_client import EndpointError, LLMClient, strip_reasoning

SECRET = "sk-test-0123456789-very-secret"


@dataclass
class ServerState:
    """What the server does next and what it has seen."""

    fail_next: int = 0
    fail_status: int = 500
    sleep_s: float = 0.0
    echo_auth: bool = False  # a 401 whose body echoes the Authorization header
    bad_body: bool = False  # a 200 without choices
    bad_body_next: int = 0  # that many 200s that are not JSON, then answers
    trickle_s: float = 0.0  # a valid answer sent a byte at a time, this many seconds apart
    models: list[str] | None = None  # GET /v1/models lists these (None: 404)
    think: bool = False  # the reply's content starts with a thinking block
    requests: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    auth: list[str | None] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)


def make_app(state: ServerState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state.requests += 1
        state.auth.append(request.headers.get("authorization"))
        state.bodies.append(body)
        state.concurrent += 1
        state.max_concurrent = max(state.max_concurrent, state.concurrent)
        try:
            if state.echo_auth:
                detail = f"invalid key: {request.headers.get('authorization')}"
                return JSONResponse({"error": detail}, status_code=401)
            if state.bad_body:
                return {"object": "chat.completion", "choices": []}
            if state.bad_body_next > 0:
                state.bad_body_next -= 1
                return PlainTextResponse('{"choices": [{"message": {"content": "cut')
            if state.fail_next > 0:
                state.fail_next -= 1
                return JSONResponse({"error": "boom"}, status_code=state.fail_status)
            if state.sleep_s:
                await asyncio.sleep(state.sleep_s)
            prompt = body["messages"][-1]["content"]
            text = f"echo {prompt}"
            if state.think:  # a thinking model served without a reasoning parser
                text = f"<think>maybe A? {prompt} -> A</think>\n\n{text}"
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
            message = {"role": "assistant", "content": text}
            answer = {"choices": [{"index": 0, "message": message}], "usage": usage}
            if state.trickle_s:
                return StreamingResponse(trickle(json.dumps(answer), state.trickle_s))
            return answer
        finally:
            state.concurrent -= 1

    @app.get("/v1/models")
    async def models():
        if state.models is None:
            return JSONResponse({"error": "no such route"}, status_code=404)
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in state.models]}

    return app


async def trickle(text: str, every_s: float):
    for ch in text:
        await asyncio.sleep(every_s)
        yield ch.encode()


@pytest.fixture(scope="module")
def server():
    state = ServerState()
    with serve(make_app(state)) as port:
        yield state, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def srv(server):
    state, url = server
    deadline = time.time() + 5
    while state.concurrent:  # requests left sleeping by an earlier timeout test
        assert time.time() < deadline
        time.sleep(0.05)
    fresh = ServerState()
    for name in fresh.__dataclass_fields__:
        setattr(state, name, getattr(fresh, name))
    return state, url


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def client(url: str, **kw) -> LLMClient:
    return LLMClient(url, "tiny", **{"backoff": 0.01, "timeout": 5.0, **kw})


def test_success_returns_text_tokens_and_sends_params(srv):
    state, url = srv
    c = client(url, temperature=0.0, top_p=1.0, max_tokens=7)
    results = c.chat_many([msgs("one two"), msgs("three")])
    assert [r.text for r in results] == ["echo one two", "echo three"]
    assert [(r.prompt_tokens, r.completion_tokens) for r in results] == [(2, 3), (1, 2)]
    assert all(r.error is None and not r.cached and r.latency_s > 0 for r in results)
    assert state.bodies[0]["model"] == "tiny"
    assert {k: state.bodies[0][k] for k in ("temperature", "top_p", "max_tokens")} == {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_tokens": 7,
    }
    assert c.stats.calls == 2 and c.stats.requests == 2 and c.stats.failures == 0
    assert (c.stats.prompt_tokens, c.stats.completion_tokens) == (3, 5)


def test_cost_accounting(srv):
    _, url = srv
    c = client(url, price_prompt_per_mtok=2.0, price_completion_per_mtok=10.0)
    c.chat_many([msgs("a b c d")])  # 4 prompt tokens, 5 completion tokens
    assert c.stats.cost_usd == pytest.approx((4 * 2.0 + 5 * 10.0) / 1e6)


def test_the_cap_stops_before_the_request_that_would_pass_it(srv, tmp_path):
    """max_calls=3 on 5 requests, 4 in flight at a time: exactly 3 reach the server, their answers
    are cached, and a client with a higher cap sends only the other 2; cached answers are free."""
    from common.api_budget import ApiBudget, BudgetExceeded
    from common.launcher import RunStopped

    state, url = srv
    batch = [msgs(f"q{i}") for i in range(5)]
    budget = ApiBudget(3, hint="rerun with a higher cap")
    c = client(url, cache_dir=tmp_path, max_concurrency=4, budget=budget)
    with pytest.raises(BudgetExceeded) as stop:
        c.chat_many(batch)
    assert isinstance(stop.value, RunStopped)
    assert str(stop.value) == (
        "API cap max_api_calls=3 reached: 3 requests sent ($0.0000); rerun with a higher cap"
    )
    assert state.requests == 3 and budget.sent == 3
    assert len(list(tmp_path.rglob("*.json"))) == 3
    with pytest.raises(BudgetExceeded):  # once stopped, nothing more goes out
        c.chat_many([msgs("q9")])
    assert state.requests == 3
    more = client(url, cache_dir=tmp_path, budget=ApiBudget(2))
    assert [r.text for r in more.chat_many(batch)] == [f"echo q{i}" for i in range(5)]
    assert state.requests == 5 and more.stats.cache_hits == 3 and more.budget.sent == 2
    # all cached: a cap of one request sends nothing and does not stop
    again = client(url, cache_dir=tmp_path, budget=ApiBudget(1))
    assert len(again.chat_many(batch)) == 5 and state.requests == 5 and again.budget.sent == 0


def test_a_request_repeated_in_one_batch_is_sent_once(srv):
    """Two identical episodes' annotation requests in one batch: one is sent, the other gets its
    answer as a cache hit (before, both went out at once, and the count depended on timing)."""
    state, url = srv
    c = client(url, max_concurrency=4)
    results = c.chat_many([msgs("a"), msgs("b"), msgs("a"), msgs("a")])
    assert [r.text for r in results] == ["echo a", "echo b", "echo a", "echo a"]
    assert [r.cached for r in results] == [False, False, True, True]
    assert state.requests == 2 and c.stats.calls == 4 and c.stats.cache_hits == 2
    state.fail_next = 10  # the first fails after its retries: each repeat is asked on its own
    failed = client(url, retries=0).chat_many([msgs("c"), msgs("c")])
    assert [r.error is not None for r in failed] == [True, True] and state.requests == 4


def test_a_retry_counts_against_the_cap(srv):
    from common.api_budget import ApiBudget, BudgetExceeded

    state, url = srv
    state.fail_next = 1
    c = client(url, retries=3, budget=ApiBudget(1))
    with pytest.raises(BudgetExceeded, match="max_api_calls=1 reached: 1 requests sent"):
        c.chat_many([msgs("x")])
    assert state.requests == 1


def test_the_usd_cap_counts_spent_dollars_and_each_request_at_its_bound(srv):
    """$1 a completion token, max_tokens 3: a request is counted at $3 before it is sent and
    costs $2 ("echo x"). Cap $6: $0 + 3 and $2 + 3 fit, $4 + 3 does not: 2 requests, $4."""
    from common.api_budget import ApiBudget, BudgetExceeded

    state, url = srv
    budget = ApiBudget(max_usd=6.0, usd_key="ape.max_api_usd")
    c = client(url, max_concurrency=1, max_tokens=3, price_completion_per_mtok=1e6, budget=budget)
    with pytest.raises(BudgetExceeded) as stop:
        c.chat_many([msgs(f"x{i}") for i in range(4)])
    assert state.requests == 2 and budget.spent_usd == pytest.approx(4.0)
    assert budget.reserved_usd == 0.0
    assert str(stop.value).startswith("API cap ape.max_api_usd=6 reached: $4.0000 spent in 2")


def test_one_budget_is_shared_by_the_clients_of_a_command(srv, tmp_path):
    from common.api_budget import ApiBudget, BudgetExceeded

    state, url = srv
    budget = ApiBudget(3)
    player = client(url, cache_dir=tmp_path / "p", budget=budget)
    annotator = client(url, cache_dir=tmp_path / "a", budget=budget)
    player.chat_many([msgs("a"), msgs("b")])
    with pytest.raises(BudgetExceeded):
        annotator.chat_many([msgs("c"), msgs("d")])
    assert state.requests == 3
    assert player.is_cached(msgs("a")) and not player.is_cached(msgs("c"))


def test_retries_500_then_succeeds(srv):
    state, url = srv
    state.fail_next = 2
    c = client(url, retries=3)
    [r] = c.chat_many([msgs("x")])
    assert r.text == "echo x" and r.error is None
    assert state.requests == 3
    assert c.stats.retries == 2 and c.stats.requests == 3 and c.stats.failures == 0


def test_retries_429(srv):
    state, url = srv
    state.fail_next, state.fail_status = 1, 429
    [r] = client(url, retries=1).chat_many([msgs("x")])
    assert r.text == "echo x" and state.requests == 2


def test_retries_exhausted_become_error_result(srv):
    state, url = srv
    state.fail_next = 10
    c = client(url, retries=2)
    [r] = c.chat_many([msgs("x")])
    assert r.text is None and "HTTP 500" in r.error
    assert state.requests == 3 and c.stats.failures == 1


def test_backoff_is_exponential(srv):
    state, url = srv
    state.fail_next = 2
    start = time.perf_counter()
    client(url, retries=2, backoff=0.2).chat_many([msgs("x")])
    assert time.perf_counter() - start >= 0.2 + 0.4


def test_client_error_is_not_retried(srv):
    state, url = srv
    state.fail_next, state.fail_status = 5, 400
    [r] = client(url, retries=3).chat_many([msgs("x")])
    assert "HTTP 400" in r.error and state.requests == 1


def test_a_malformed_body_is_retried_and_the_next_answer_taken(srv):
    state, url = srv
    state.bad_body_next = 1  # one 200 whose body is cut JSON
    c = client(url, retries=3)
    [r] = c.chat_many([msgs("x")])
    assert r.text == "echo x" and r.error is None
    assert state.requests == 2 and c.stats.retries == 1 and c.stats.failures == 0


def test_a_body_without_choices_every_time_is_an_error_after_the_retries(srv):
    state, url = srv
    state.bad_body = True
    c = client(url, retries=2)
    [r] = c.chat_many([msgs("x")])
    assert r.text is None and "malformed response" in r.error and state.requests == 3
    assert c.stats.failures == 1


def test_a_trickling_server_is_cut_at_the_deadline_though_no_read_times_out(srv):
    state, url = srv
    state.trickle_s = 0.05  # a byte every 50 ms: no wait reaches the 1 s timeout
    c = client(url, timeout=1.0, deadline=0.6, retries=0)
    start = time.perf_counter()
    [r] = c.chat_many([msgs("x")])
    took = time.perf_counter() - start
    assert r.text is None and "0.6s deadline" in r.error
    # the whole answer (~150 bytes) would take ~7.5 s; cut within a byte or two of 0.6 s
    assert 0.6 <= took < 2.0
    state.trickle_s = 0.0


def test_accept_refuses_a_reply_which_is_counted_and_never_cached(srv, tmp_path):
    state, url = srv
    c = client(url, cache_dir=tmp_path)
    wants_two = lambda text: text.endswith("two")  # noqa: E731
    results = c.chat_many([msgs("one"), msgs("two")], accept=wants_two)
    assert [(r.text, r.rejected) for r in results] == [("echo one", True), ("echo two", False)]
    assert c.stats.rejected == 1 and c.stats.failures == 0
    assert len(list(tmp_path.rglob("*.json"))) == 1  # only the accepted reply
    again = c.chat_many([msgs("one"), msgs("two")], accept=wants_two)
    assert [r.cached for r in again] == [False, True] and state.requests == 3


def test_a_cached_reply_the_check_refuses_is_asked_again(srv, tmp_path):
    state, url = srv
    c = client(url, cache_dir=tmp_path)
    c.chat_many([msgs("one")])  # cached before any check
    [r] = c.chat_many([msgs("one")], accept=lambda text: False)
    assert not r.cached and r.rejected and state.requests == 2


def test_probe_passes_when_the_model_is_served(srv):
    state, url = srv
    state.models = ["other", "tiny"]
    client(url).probe()
    assert state.requests == 0  # the model list was enough


def test_probe_names_the_served_models_when_the_model_is_not_among_them(srv):
    state, url = srv
    state.models = ["Qwen/Qwen3-8B"]
    with pytest.raises(EndpointError, match=r"serves \['Qwen/Qwen3-8B'\], not 'tiny'"):
        client(url).probe()


def test_probe_without_a_model_list_sends_one_token_chat(srv):
    state, url = srv  # GET /v1/models is a 404 here
    client(url).probe()
    assert state.requests == 1 and state.bodies[0]["max_tokens"] == 1
    state.fail_next, state.fail_status = 1, 404
    with pytest.raises(EndpointError, match="cannot answer a chat request: HTTP 404"):
        client(url, retries=0).probe()


def test_probe_of_a_closed_port_says_not_answering():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EndpointError, match=r"127.0.0.1:\d+/v1 \(model tiny\) is not answering"):
        client(f"http://127.0.0.1:{port}/v1").probe(timeout=2.0)


def test_timeout_becomes_error_result(srv):
    state, url = srv
    state.sleep_s = 2.0
    c = client(url, timeout=0.2, retries=1)
    [r] = c.chat_many([msgs("slow")])
    assert r.text is None and "timeout" in r.error
    assert state.requests == 2 and c.stats.failures == 1


def test_unreachable_server_becomes_error_result():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    c = client(f"http://127.0.0.1:{port}/v1", retries=1)
    results = c.chat_many([msgs("a"), msgs("b")])
    assert all(r.text is None and "connection error" in r.error for r in results)
    assert c.stats.failures == 2 and c.stats.requests == 4


def test_a_credential_in_the_url_is_masked_in_errors_and_repr(caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    caplog.set_level(logging.DEBUG)
    c = client(f"http://user:URLKEY1@127.0.0.1:{port}/v1?api_key=URLKEY2", retries=1)
    [result] = c.chat_many([msgs("a")])
    assert f"connection error at http://user:***@127.0.0.1:{port}/v1?api_key=***" in result.error
    shown = [result.error, repr(c), caplog.text]
    assert all("URLKEY" not in s for s in shown)


def test_cache_serves_second_call_from_disk(srv, tmp_path):
    state, url = srv
    c = client(url, cache_dir=tmp_path)
    [first] = c.chat_many([msgs("cache me")])
    assert state.requests == 1 and not first.cached
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and not list(tmp_path.rglob("*.tmp"))
    assert json.loads(files[0].read_text())["text"] == "echo cache me"
    # A fresh client over the same folder: served from disk, no request.
    c2 = client(url, cache_dir=tmp_path)
    [second] = c2.chat_many([msgs("cache me")])
    assert state.requests == 1
    assert second.cached and second.text == first.text
    assert (second.prompt_tokens, second.completion_tokens) == (2, 3)
    assert c2.stats.cache_hits == 1 and c2.stats.requests == 0 and c2.stats.prompt_tokens == 0


def test_cache_key_covers_params_and_tag(srv, tmp_path):
    state, url = srv
    client(url, cache_dir=tmp_path).chat_many([msgs("q")])
    client(url, cache_dir=tmp_path, temperature=0.7).chat_many([msgs("q")])
    client(url, cache_dir=tmp_path).chat_many([msgs("q")], cache_tag="repeat-1")
    client(url, cache_dir=tmp_path).chat_many([msgs("q")])  # hit
    assert state.requests == 3


def test_failures_are_not_cached_and_corrupt_entry_is_a_miss(srv, tmp_path):
    state, url = srv
    state.fail_next = 1
    c = client(url, cache_dir=tmp_path, retries=0)
    assert "HTTP 500" in c.chat(msgs("z")).error
    assert not list(tmp_path.rglob("*.json"))
    key = c.cache_key(msgs("z"))
    path = tmp_path / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    r = c.chat(msgs("z"))
    assert r.text == "echo z" and not r.cached and state.requests == 2
    assert json.loads(path.read_text())["text"] == "echo z"


def test_concurrency_is_bounded(srv):
    state, url = srv
    state.sleep_s = 0.15
    c = client(url, max_concurrency=3)
    results = c.chat_many([msgs(f"m{i}") for i in range(12)])
    assert [r.text for r in results] == [f"echo m{i}" for i in range(12)]
    assert state.max_concurrent == 3


def test_concurrency_bound_holds_across_threads(srv):
    state, url = srv
    state.sleep_s = 0.15
    c = client(url, max_concurrency=2)
    threads = [
        threading.Thread(target=c.chat_many, args=([msgs(f"t{t}-{i}") for i in range(4)],))
        for t in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state.requests == 12 and state.max_concurrent == 2


def test_key_is_sent_but_never_shown(srv, monkeypatch, caplog, tmp_path):
    state, url = srv
    monkeypatch.setenv("TEACHER_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    c = client(url, api_key_env="TEACHER_KEY", cache_dir=tmp_path, retries=1)
    ok = c.chat(msgs("hello"))
    assert state.auth[-1] == f"Bearer {SECRET}"
    state.fail_next = 5
    failed = c.chat(msgs("fail"))
    state.echo_auth = True
    echoed = c.chat(msgs("echo"))
    assert "***" in echoed.error
    shown = [repr(c), str(c), caplog.text, repr(ok), repr(failed), repr(echoed)]
    shown += [p.read_text() for p in tmp_path.rglob("*.json")]
    assert all(SECRET not in s for s in shown)
    assert "TEACHER_KEY" in repr(c)


def test_no_key_sends_no_authorization(srv, monkeypatch):
    state, url = srv
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    client(url, api_key_env="NO_SUCH_KEY_VAR").chat(msgs("x"))
    assert state.auth[-1] is None


def test_malformed_input_raises_before_any_request(srv):
    state, url = srv
    c = client(url)
    with pytest.raises(ValueError, match=r"messages_list\[1\]\[0\].*content"):
        c.chat_many([msgs("ok"), [{"role": "user"}]])
    with pytest.raises(ValueError, match=r"messages_list\[0\]"):
        c.chat_many([[]])
    assert state.requests == 0
    assert c.chat_many([]) == []


def test_a_thinking_block_in_the_content_is_cut_off_and_counted(srv):
    """GLM-4.7-Flash or Qwen3 served without a reasoning parser: the verdict is what follows the
    reasoning, never a letter inside it."""
    state, url = srv
    state.think = True
    c = client(url)
    (result,) = c.chat_many([msgs("B")])
    assert result.text == "echo B" and c.stats.reasoning_stripped == 1
    state.think = False
    (plain,) = c.chat_many([msgs("C")])
    assert plain.text == "echo C" and c.stats.reasoning_stripped == 1


@pytest.mark.parametrize(
    ("content", "answer"),
    [
        ("A", "A"),
        ("<think>a</think>B", "B"),
        ("<think>a</think><think>b</think>\n C \n", "C"),
        ("a</think>B", "B"),  # the template opened the block in the prompt
        ("<think>never closed", "<think>never closed"),
    ],
)
def test_strip_reasoning(content, answer):
    assert strip_reasoning(content) == answer
