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
    usage: bool = True  # False: the answer has no usage (some servers and proxies)
    reply_model: str | None = None  # the answer's model field (None: none)
    models_fail_next: int = 0  # that many GET /v1/models answered 503 first
    refuse_next: int = 0  # that many answers "broken" (the callers' checks refuse it)
    requests: int = 0
    models_requests: int = 0
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
            if state.refuse_next > 0:
                state.refuse_next -= 1
                text = "broken"
            usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
            message = {"role": "assistant", "content": text}
            answer = {"choices": [{"index": 0, "message": message}], "usage": usage}
            if not state.usage:
                del answer["usage"]
            if state.reply_model is not None:
                answer["model"] = state.reply_model
            if state.trickle_s:
                return StreamingResponse(trickle(json.dumps(answer), state.trickle_s))
            return answer
        finally:
            state.concurrent -= 1

    @app.get("/v1/models")
    async def models():
        state.models_requests += 1
        if state.models_fail_next > 0:
            state.models_fail_next -= 1
            return JSONResponse({"error": "loading"}, status_code=503)
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


# --- the reply's model, broken replies asked again, usage, the probe's retries ----------------


def test_a_reply_from_another_model_is_refused_never_cached_and_counted(srv, tmp_path):
    """A restarted server or a proxy answering as another model: before, the reply was taken and
    cached, and the judge changed without a word."""
    state, url = srv
    state.reply_model = "other-model"
    c = client(url, cache_dir=tmp_path, retries=2)
    [r] = c.chat_many([msgs("x")])
    assert r.text is None and r.wrong_model and r.model == "other-model"
    assert "came from model 'other-model', not 'tiny'" in r.error
    assert state.requests == 1  # a definite answer: not retried
    assert (c.stats.wrong_model, c.stats.failures) == (1, 1)
    assert not list(tmp_path.rglob("*.json"))
    state.reply_model = "tiny-2025-01-01"  # a dated snapshot of the model asked for
    [ok] = c.chat_many([msgs("x")])
    assert (ok.text, ok.model, c.stats.wrong_model) == ("echo x", "tiny-2025-01-01", 1)
    assert len(list(tmp_path.rglob("*.json"))) == 1
    state.reply_model = None  # a server that names no model: taken
    [plain] = c.chat_many([msgs("y")])
    assert plain.text == "echo y" and plain.model == ""


@pytest.mark.parametrize(
    ("configured", "replied", "also", "same"),
    [
        ("gpt-4o", "gpt-4o", (), True),
        ("gpt-4o", "GPT-4o", (), True),
        ("gpt-4o", "openai/gpt-4o", (), True),  # a provider's prefix
        ("openai/gpt-4o", "gpt-4o", (), True),
        ("Qwen3-8B", "Qwen/Qwen3-8B", (), True),
        ("gpt-4o", "gpt-4o-2024-08-06", (), True),  # a dated snapshot
        ("claude-3-5-sonnet", "claude-3-5-sonnet-20241022", (), True),
        ("gpt-4o", "openai/gpt-4o-2025-01-01", (), True),
        ("gpt-4o-2024-08-06", "gpt-4o", (), False),  # the undated name may be another snapshot
        ("gpt-4o", "gpt-4o-mini", (), False),
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-4B", (), False),
        ("org1/judge", "org2/judge", (), False),  # two prefixes: two models
        ("gpt-4", "gpt-4-0613", (), False),
        ("gpt-4", "gpt-4-0613", ("gpt-4-0613",), True),  # teacher.reply_models
        ("judge", "anything", ("*",), True),
    ],
)
def test_model_matches_the_documented_names(configured, replied, also, same):
    from common.llm_client import model_matches

    assert model_matches(configured, replied, also) is same


def test_a_refused_reply_is_asked_again_then_given_up(srv, tmp_path):
    """A reply the caller's check refuses (a broken verdict) is asked again, ``reasks`` times at
    most; before, it came back refused at once."""
    state, url = srv
    c = client(url, cache_dir=tmp_path, reasks=2)
    good = lambda text: text != "broken"  # noqa: E731
    state.refuse_next = 1
    [r] = c.chat_many([msgs("one")], accept=good)
    assert (r.text, r.rejected, state.requests) == ("echo one", False, 2)
    assert (c.stats.rejected, c.stats.reasked) == (1, 1)
    assert len(list(tmp_path.rglob("*.json"))) == 1
    state.refuse_next = 5
    [bad] = c.chat_many([msgs("two")], accept=good)
    assert (bad.text, bad.rejected, state.requests) == ("broken", True, 5)  # 1 + 2 asks again
    assert (c.stats.rejected, c.stats.reasked) == (4, 3)
    assert len(list(tmp_path.rglob("*.json"))) == 1  # never cached


def test_without_usage_the_dollar_cap_counts_the_bytes_bound_and_holds(srv):
    """No usage in the answers: before, 4 of 4 requests went out and $0 was counted. $1 a token,
    max_tokens 5, no tokenizer: "x0" is 2 bytes + 64 + 8 (template allowance) = 74 prompt
    tokens, "echo x0" 7 bytes, at most 5 completion tokens: $79 counted and reserved a request.
    Cap $200: $0 + 79 and $79 + 79 fit, $158 + 79 does not."""
    from common.api_budget import ApiBudget, BudgetExceeded

    state, url = srv
    state.usage = False
    budget = ApiBudget(max_usd=200.0)
    c = client(
        url,
        max_concurrency=1,
        max_tokens=5,
        price_prompt_per_mtok=1e6,
        price_completion_per_mtok=1e6,
        budget=budget,
    )
    with pytest.raises(BudgetExceeded) as stop:
        c.chat_many([msgs(f"x{i}") for i in range(4)])
    assert state.requests == 2 and budget.spent_usd == pytest.approx(158.0)
    assert (c.stats.usage_missing, c.stats.prompt_tokens, c.stats.completion_tokens) == (2, 148, 10)
    assert str(stop.value) == (
        "API cap max_api_usd=200 reached: $158.0000 spent in 2 requests, the next could cost "
        "$79.0000"
    )


def test_the_dollar_cap_reserves_the_worst_case_so_concurrent_requests_cannot_pass_it(srv):
    """Usage present, "a a a a a a a a a a": 19 characters, 10 tokens, $1 a prompt token. Before,
    each request was reserved at 19 / 4 = 5 tokens, so two in flight fit a $15 cap and spent $20.
    Now each is reserved at its worst case, 19 bytes + 72 = $91: none is sent."""
    from common.api_budget import ApiBudget, BudgetExceeded

    state, url = srv
    budget = ApiBudget(max_usd=15.0)
    c = client(url, max_concurrency=2, price_prompt_per_mtok=1e6, budget=budget)
    with pytest.raises(BudgetExceeded, match=r"the next could cost \$91.0000"):
        c.chat_many([msgs("a a a a a a a a a a"), msgs("a a a a a a a a a b")])
    assert budget.spent_usd <= 15.0 and state.requests == 0


def test_a_timeout_is_counted_at_its_bound_an_http_error_at_nothing(srv):
    """The server may have generated (and billed) an answer the client stopped waiting for."""
    from common.api_budget import ApiBudget

    state, url = srv
    budget = ApiBudget(max_usd=1000.0)
    prices = {"price_prompt_per_mtok": 1e6, "price_completion_per_mtok": 1e6}
    c = client(url, timeout=0.2, retries=0, max_tokens=3, budget=budget, **prices)
    state.sleep_s = 2.0
    [r] = c.chat_many([msgs("slow")])  # 4 bytes + 72 prompt tokens + 3 completion: $79
    assert r.error and budget.spent_usd == pytest.approx(79.0)
    state.sleep_s, state.fail_next = 0.0, 1
    [r] = c.chat_many([msgs("fail")])
    assert "HTTP 500" in r.error and budget.spent_usd == pytest.approx(79.0)


def test_with_a_tokenizer_an_answer_without_usage_is_counted_exactly(srv, tmp_path):
    """``tokenizer`` (a folder): the prompt through its chat template, the reply by its tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "one": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
    tok.chat_template = "{% for m in messages %}{{ m.content }} {% endfor %}"
    tok.save_pretrained(tmp_path / "tok")
    state, url = srv
    state.usage = False
    c = client(url, tokenizer=str(tmp_path / "tok"))
    [r] = c.chat_many([msgs("one two three")])
    assert (r.text, r.prompt_tokens, r.completion_tokens) == ("echo one two three", 3, 4)
    assert c.stats.usage_missing == 1


def test_the_probe_asks_again_while_the_server_is_not_answering(srv):
    """A server still loading (503) is waited for with the client's retries; before, one 503 sent
    the probe to a chat request, and a server down at that moment stopped the run."""
    state, url = srv
    state.models, state.models_fail_next = ["tiny"], 2
    client(url, retries=3).probe()
    assert state.models_requests == 3 and state.requests == 0
    state.models_fail_next = 5
    with pytest.raises(EndpointError, match=r"is not answering: HTTP 503 .*\(2 attempts\)"):
        client(url, retries=1).probe()
    assert state.models_requests == 5


def test_the_probe_of_a_closed_port_is_retried_with_backoff():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    with pytest.raises(EndpointError, match=r"is not answering: ConnectError.*\(3 attempts\)"):
        client(f"http://127.0.0.1:{port}/v1", retries=2, backoff=0.1).probe(timeout=2.0)
    assert time.perf_counter() - start >= 0.1 + 0.2
