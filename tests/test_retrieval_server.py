"""The retrieval server (a real subprocess on loopback) and the HTTP client against it."""

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvicorn

from common.launcher import STOPPED_EXIT_CODE, RunStopped, run_command
from common.retrieval import BM25Retriever, Doc, HTTPRetriever, RetrievalError, read_corpus
from common.retrieval.client import RetrievalOutage, RetrievalRejected
from common.retrieval.server import ServerLimits, create_app, server_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data" / "retrieval"
JSON = {"content-type": "application/json"}


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout}s")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """Search-R1 jsonl: the 10 Wikipedia-2018 rows and the HotpotQA sample's paragraphs."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    rows = [json.loads(line) for line in (DATA / "wiki18_sample_corpus.jsonl").open()]
    seen = set()
    for line in (DATA / "hotpotqa_sample.jsonl").open():
        for title, sentences in json.loads(line)["context"]:
            if title not in seen:
                seen.add(title)
                rows.append(
                    {"id": f"h{len(seen)}", "contents": f'"{title}"\n' + "".join(sentences)}
                )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="session")
def server(corpus, tmp_path_factory, free_port) -> Iterator[str]:
    """`python -m common.retrieval index` then `serve --index`, as a user runs them."""
    index = tmp_path_factory.mktemp("index") / "bm25"
    cli = [sys.executable, "-m", "common.retrieval"]
    subprocess.run(
        [*cli, "index", "--corpus", str(corpus), "--out", str(index)], check=True, cwd=ROOT
    )
    port = free_port()
    # numpy backend: numba's kernel compilation would add seconds; its ranking is tested apart.
    args = ["serve", "--index", str(index), "--port", str(port), "--bm25-backend", "numpy"]
    proc = subprocess.Popen([*cli, *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_health(server, corpus):
    assert httpx.get(server + "/health").json() == {"status": "ok", "num_docs": 210}


def test_search_r1_request_gives_search_r1_answer(server, corpus):
    contents = {r["id"]: r["contents"] for r in map(json.loads, corpus.open())}
    body = {"queries": ["Evan Morris lobbyist in Washington", "Horatio Hale in America"], "topk": 2}
    scored = httpx.post(server + "/retrieve", json={**body, "return_scores": True}).json()
    plain = httpx.post(server + "/retrieve", json=body).json()
    assert list(scored) == ["result"] and len(scored["result"]) == 2
    for items in scored["result"]:
        assert len(items) == 2
        for item in items:
            assert set(item) == {"document", "score"} and set(item["document"]) == {
                "id",
                "contents",
            }
            assert item["document"]["contents"] == contents[item["document"]["id"]]
        assert items[0]["score"] >= items[1]["score"] > 0
    assert scored["result"][0][0]["document"]["id"] == "0"
    assert scored["result"][1][0]["document"]["id"] == "1"
    assert plain == {"result": [[item["document"] for item in items] for items in scored["result"]]}


def test_topk_defaults_to_server_setting(server):
    [items] = httpx.post(server + "/retrieve", json={"queries": ["the film director"]}).json()[
        "result"
    ]
    assert len(items) == 3


def test_client_equals_in_process_retriever(server, corpus):
    questions = [json.loads(line)["question"] for line in (DATA / "hotpotqa_sample.jsonl").open()]
    local = BM25Retriever.from_docs(read_corpus(corpus), backend="numpy").search(questions, 5)
    with HTTPRetriever(server, batch_size=7) as client:  # 20 queries: 3 requests
        remote = client.search(questions, 5)
    assert remote == local  # JSON carries the float scores exactly


def test_concurrent_requests_get_their_own_answers(server):
    queries = [[q] for q in ("Ed Wood", "Horatio Hale", "Black Book film", "Moscow university")]
    with HTTPRetriever(server) as client:
        expected = [client.search(q, 3) for q in queries]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda q: client.search(q, 3), queries * 4))
    assert got == expected * 4


@pytest.mark.parametrize(
    ("kwargs", "status", "detail"),
    [
        ({"content": b"{not json", "headers": JSON}, 400, "body: invalid JSON"),
        ({"content": b'{"queries": ["a"]}'}, 422, "body: Input should be a valid dict"),
        ({"json": {"queries": "one string"}}, 422, "queries: "),
        ({"json": {"queries": ["ok", 3]}}, 422, "queries.1: "),
        ({"json": {"topk": 3}}, 422, "queries: Field required"),
        ({"json": {"queries": ["a"], "topk": 101}}, 422, "topk: must be between 1 and 100"),
        ({"json": {"queries": ["a"], "topk": "3"}}, 422, "topk: "),
        ({"json": {"queries": ["a"] * 513}}, 422, "queries: at most 512"),
        ({"json": {"queries": ["a" * 2049]}}, 422, "queries.0: at most 2048 characters"),
        ({"json": [1, 2]}, 422, "body: Input should be a valid dict"),
        (
            {"json": {"queries": ["a"], "topK": 5}},
            422,
            "unknown field topK; allowed: queries, topk, return_scores",
        ),
        ({"json": {"queries": ["a"], "k": 1, "x": 2}}, 422, "unknown fields k, x; allowed: "),
        (
            {"content": b'{"queries": ["caf\xe9"]}', "headers": JSON},
            400,
            "body: not UTF-8 (byte 0xe9 at offset 17)",
        ),
    ],
)
def test_bad_request_gets_4xx_and_server_keeps_serving(server, kwargs, status, detail):
    response = httpx.post(server + "/retrieve", **kwargs)
    assert response.status_code == status
    assert response.json()["detail"].startswith(detail)
    good = httpx.post(server + "/retrieve", json={"queries": ["Ed Wood"], "topk": 1})
    assert good.status_code == 200 and len(good.json()["result"][0]) == 1


def test_body_over_the_limit_gets_413_before_it_is_read(server):
    limit = ServerLimits().max_body_bytes
    big = json.dumps({"queries": ["Ed Wood " * 250] * 4500}).encode()  # 9 MB
    assert len(big) > limit
    response = httpx.post(server + "/retrieve", content=big, headers=JSON)
    assert response.status_code == 413
    assert response.json()["detail"] == (
        f"body: at most {limit} bytes (max_body_bytes), got {len(big)} bytes"
    )
    # no Content-Length (chunked): cut off once past the limit
    chunks = (b" " * 10_000 for _ in range(1000))  # 10 MB
    response = httpx.post(server + "/retrieve", content=chunks, headers=JSON)
    assert response.status_code == 413
    assert response.json()["detail"].startswith(f"body: at most {limit} bytes")
    good = httpx.post(server + "/retrieve", json={"queries": ["Ed Wood"], "topk": 1})
    assert good.status_code == 200 and len(good.json()["result"][0]) == 1


def test_client_reports_a_too_large_body(threaded_server):
    url = threaded_server(FlakyRetriever(failures=0), ServerLimits(max_body_bytes=100))
    with HTTPRetriever(url, retries=0) as client:
        assert client.search(["short"], 1)[0][0].text == "short"
        with pytest.raises(RetrievalError, match=r"HTTP 413\): body: at most 100 bytes"):
            client.search(["q" * 200], 1)


def test_warm_up_query_uses_words_of_the_corpus(corpus, tiny_world):
    from common.retrieval.__main__ import warmup_query

    for path in (corpus, tiny_world / "corpus.jsonl"):
        retriever = BM25Retriever.from_corpus(path, backend="numpy")
        assert retriever.search([warmup_query(retriever)], 1)[0], path
    # the words the warm-up used to search for are not in the tiny world at all
    assert retriever.search(["warm up"], 1) == [[]]


def test_docs_curl_example_works_on_the_seed_0_world(tiny_world, threaded_server):
    readme = (ROOT / "docs" / "retrieval.md").read_text()
    [(header, body)] = re.findall(r"curl -s \S+/retrieve -H '([^']*)' -d '([^']*)'", readme)
    assert "--corpus runs/tinyworld/seed0/corpus.jsonl" in readme
    url = threaded_server(BM25Retriever.from_corpus(tiny_world / "corpus.jsonl", backend="numpy"))
    name, value = header.split(": ")
    response = httpx.post(url + "/retrieve", content=body, headers={name: value})
    assert response.status_code == 200, response.text
    query = json.loads(body)["queries"][0]
    top = response.json()["result"][0][0]
    assert top["document"]["contents"].startswith(f'"{query}"\n') and top["score"] > 0


def test_serve_on_a_port_in_use_is_one_error_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *(sys.executable, "-m", "common.retrieval", "serve"),
                *("--corpus", str(DATA / "wiki18_sample_corpus.jsonl"), "--port", str(port)),
                *("--bm25-backend", "numpy"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 2
    assert "serving" not in result.stdout
    expected = f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert result.stderr.strip() == expected


def test_client_reports_rejected_request(server):
    with HTTPRetriever(server) as client, pytest.raises(RetrievalError, match="HTTP 422.*topk"):
        client.search(["a"], 1000)


def test_a_422_mid_run_stops_in_one_line_naming_the_url_and_what_to_change(threaded_server, capsys):
    """A request the server refuses (topk over its --max-topk) is not retried: the command
    prints one line, `stopped: ...`, naming the URL, the server's reason and the flag, and exits
    3 (before, a RetrievalError's traceback)."""
    url = threaded_server(FlakyRetriever(failures=0), ServerLimits(max_topk=5))

    def main() -> int:
        with HTTPRetriever(url) as client:
            client.search(["a", "bb"], 10)
        return 0

    with pytest.raises(SystemExit) as exit_:
        run_command(main)
    assert exit_.value.code == STOPPED_EXIT_CODE == 3
    assert capsys.readouterr().err == (
        f"stopped: retrieval server {url}/retrieve rejected the request (HTTP 422): topk: must "
        "be between 1 and 5, got 10 (2 queries, the longest 2 characters, topk 10); lower the "
        "run's topk, or restart the server with a larger --max-topk\n"
    )
    expected = (
        r"queries\.0: at most 2048 characters, got 3000 \(1 query, the longest 3000 characters, "
        r"topk 1\); restart the server with --max-query-chars of at least 4000 \(the client cuts "
        r"queries to it\)$"
    )
    client = HTTPRetriever(url, max_query_chars=4000)
    with client, pytest.raises(RetrievalRejected, match=expected):
        client.search(["x" * 3000], 1)


def test_unreachable_server_fails_fast_naming_url(free_port):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RetrievalError, match=f"{url}/retrieve failed 2 times"):
        HTTPRetriever(url, timeout=0.5, retries=1, backoff=0.01).search(["q"], 3)
    assert time.monotonic() - start < 3


def test_a_credential_in_the_server_url_is_masked_in_errors(free_port):
    url = f"http://user:URLKEY@127.0.0.1:{free_port()}"
    with pytest.raises(RetrievalError) as err:
        HTTPRetriever(url, timeout=0.5, retries=0).search(["q"], 3)
    assert "URLKEY" not in str(err.value) and "http://user:***@127.0.0.1" in str(err.value)


class FlakyRetriever:
    """A backend that fails its first `failures` searches, then answers."""

    def __init__(self, failures: int):
        self.failures = failures

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        if self.failures:
            self.failures -= 1
            raise OSError("index file temporarily unavailable")
        return [[Doc("7", "T", q, 1.5)] for q in queries]


@pytest.fixture
def threaded_server() -> Iterator[Callable[..., str]]:
    servers = []

    def start(retriever, limits=None) -> str:
        # The socket is bound here and handed over: no window in which the port is free.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        app = create_app(retriever, 1, limits)
        srv = uvicorn.Server(server_config(app, limits, log_level="error"))  # as `serve` runs it
        thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((srv, thread, sock))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        wait_healthy(url, timeout=20)
        return url

    yield start
    for srv, thread, sock in servers:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_client_retries_5xx_then_succeeds(threaded_server):
    url = threaded_server(FlakyRetriever(failures=2))
    with HTTPRetriever(url, retries=2, backoff=0.01) as client:
        assert client.search(["x", "y"], 1) == [
            [Doc("7", "T", "x", 1.5)],
            [Doc("7", "T", "y", 1.5)],
        ]


def test_client_gives_up_after_retries(threaded_server):
    url = threaded_server(FlakyRetriever(failures=5))
    with (
        HTTPRetriever(url, retries=1, backoff=0.01) as client,
        pytest.raises(RetrievalError, match="failed 2 times.*HTTP 500.*temporarily unavailable"),
    ):
        client.search(["x"], 1)


def test_client_splits_batches_above_batch_size(threaded_server):
    url = threaded_server(FlakyRetriever(failures=0), ServerLimits(max_queries=2))
    queries = ["a", "b", "c", "d", "e"]
    with HTTPRetriever(url, batch_size=2) as client:
        assert [r[0].text for r in client.search(queries, 1)] == queries
    with (
        HTTPRetriever(url, batch_size=512) as client,
        pytest.raises(RetrievalError, match="at most 2"),
    ):
        client.search(queries, 1)


def test_serve_without_index_or_corpus_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_index"
    result = subprocess.run(
        [sys.executable, "-m", "common.retrieval", "serve", "--index", str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip() == f"error: {missing}: no index there, and no --corpus to build one"
    )


def test_a_failed_search_is_a_500_on_a_connection_that_stays_open(threaded_server):
    """A client that reuses its connection after a 500 gets the next answer on it. (A backend
    exception that left the app made uvicorn close the connection after the 500, and the
    client's next request on it became a transport error now and then: a lost retry.)"""
    url = threaded_server(FlakyRetriever(failures=1))
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    body, headers = json.dumps({"queries": ["x"], "topk": 1}), {"Content-Type": "application/json"}
    statuses, sockets = [], []
    try:
        for _ in range(2):
            conn.request("POST", "/retrieve", body, headers)
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
            sockets.append(conn.sock)
            assert response.getheader("connection") != "close"
    finally:
        conn.close()
    assert statuses == [500, 200]
    assert sockets[0] is sockets[1] is not None


def test_the_default_limits_fit_together_the_largest_request_is_served(threaded_server):
    """512 queries of 2,048 characters (the default max_queries and max_query_chars), each
    character escaped as JSON's \\uXXXX: before, a 1 MiB body limit refused such a request."""
    limits = ServerLimits()
    url = threaded_server(FlakyRetriever(failures=0))
    queries = ["\u00e9" * limits.max_query_chars] * limits.max_queries
    body = json.dumps({"queries": queries, "topk": 1}).encode()  # ensure_ascii: 6 bytes a char
    assert len(body) > 6 * 2**20
    response = httpx.post(url + "/retrieve", content=body, headers=JSON, timeout=60)
    assert response.status_code == 200 and len(response.json()["result"]) == limits.max_queries


def test_a_query_over_the_servers_limit_is_cut_and_counted_not_a_422(threaded_server, caplog):
    url = threaded_server(FlakyRetriever(failures=0))
    with HTTPRetriever(url) as client:
        docs = client.search(["x" * 3000, "short"], 1)
    assert [len(d[0].text) for d in docs] == [2048, 5]  # the server saw the cut query
    assert client.cut_queries == 1
    assert "1 of 2 queries over 2048 characters cut" in caplog.text


def test_an_outage_past_the_wait_stops_the_run_in_one_line(free_port):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RetrievalOutage) as stop:
        HTTPRetriever(url, timeout=0.5, backoff=0.05, max_wait=0.6).search(["q"], 3)
    assert 0.3 < time.monotonic() - start < 3
    assert isinstance(stop.value, RunStopped)  # the command prints it and exits 3
    message = str(stop.value)
    assert "\n" not in message and f"{url}/retrieve failed" in message
    assert "max_wait 0.6 s" in message and "ConnectError" in message


def test_a_server_restarted_within_the_wait_is_waited_for(free_port):
    """The server is down when the request starts and comes back 1.5 s later (a restart takes
    13-22 s at paper scale): the search waits and succeeds, where it gave up after 3.5 s."""
    port = free_port()
    app = create_app(FlakyRetriever(failures=0), 1)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    timer = threading.Timer(1.5, srv.run)
    timer.start()
    try:
        client = HTTPRetriever(f"http://127.0.0.1:{port}", timeout=2, backoff=0.1, max_wait=30)
        assert client.search(["back"], 1) == [[Doc("7", "T", "back", 1.5)]]
    finally:
        srv.should_exit = True
        timer.join(timeout=15)


def test_probe_passes_on_a_serving_server_and_stops_on_a_closed_port(threaded_server, free_port):
    from common.retrieval.client import probe_retrieval

    url = threaded_server(FlakyRetriever(failures=0))
    probe_retrieval(url)  # one query answered: nothing raised
    probe_retrieval("")  # no server configured: nothing to probe
    closed = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RetrievalOutage, match=f"^retrieval server {closed}/retrieve does not "
                       "answer a one-query probe: ConnectError"):  # fmt: skip
        probe_retrieval(closed)
    assert time.monotonic() - start < 5  # no retries before a run has started


def test_probe_of_a_failing_server_names_its_answer(threaded_server):
    url = threaded_server(FlakyRetriever(failures=1))  # its one search fails: HTTP 500
    with pytest.raises(RetrievalOutage, match="HTTP 500"):
        HTTPRetriever(url).probe()
