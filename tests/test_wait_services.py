"""``make wait-services`` (experiments.wait_services) against real servers on loopback: the
retrieval server's app and the stand-in OpenAI-compatible teacher, started late in threads."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import uvicorn

from common.retrieval import BM25Retriever, Doc
from common.retrieval.server import create_app, server_config
from experiments.rehearse.endpoint import serve_endpoint
from experiments.wait_services import main

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / "eviback" / "configs" / "tiny.yaml")


@contextmanager
def retrieval_server(port: int) -> Iterator[None]:
    """The retrieval server's app over three passages, on ``port``, in a thread."""
    docs = [Doc(str(i), t, f"{t} is a city.", 0.0) for i, t in enumerate(["Oslo", "Lima", "Rome"])]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    srv = uvicorn.Server(server_config(create_app(BM25Retriever.from_docs(docs), 3),
                                       log_level="error"))  # fmt: skip
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


def args(retrieval_port: int, teacher_port: int, *more: str, model: str = "standin") -> list[str]:
    return [
        "--config", CONFIG,
        f"assets.retrieval_url=http://127.0.0.1:{retrieval_port}/retrieve",
        f"assets.teacher_endpoint=http://127.0.0.1:{teacher_port}/v1",
        f"assets.teacher_model={model}", "teacher.backend=llm", *more,
    ]  # fmt: skip


def test_it_waits_for_services_that_start_late_then_returns(free_port, capsys):
    """The retrieval server starts after 1 s, the teacher after 2.5 s; the wait prints progress
    while they are down and returns 0 once both answer."""
    r_port, t_port = free_port(), free_port()
    with ExitStack() as stack:

        def start_late() -> None:
            time.sleep(1.0)
            stack.enter_context(retrieval_server(r_port))
            time.sleep(1.5)
            stack.enter_context(serve_endpoint(port=t_port, served=["standin"]))

        starter = threading.Thread(target=start_late)
        starter.start()
        t0 = time.monotonic()
        code = main(args(r_port, t_port, "--wait-s", "60", "--every-s", "0.5"))
        waited = time.monotonic() - t0
        starter.join()
    assert code == 0
    assert 2.5 <= waited < 30
    lines = capsys.readouterr().out.splitlines()
    retrieval = f"retrieval http://127.0.0.1:{r_port}/retrieve"
    teacher = f"teacher http://127.0.0.1:{t_port}/v1 (standin)"
    assert lines[0] == f"[wait] {retrieval}, {teacher}: up to 60 s"
    # progress while both were down: the reason each is not ready
    assert any(
        x.startswith("[wait] ")
        and f"{retrieval}: not answering (connection refused); {teacher}: not answering" in x
        for x in lines
    )
    assert any(x.startswith(f"[wait] {retrieval}: answers (") for x in lines)
    assert any(x.startswith(f"[wait] {teacher}: answers (") for x in lines)
    assert lines[-1].startswith("[wait] all 2 service(s) answer (")


def test_past_the_bound_it_names_what_did_not_answer_and_exits_3(free_port, capsys):
    r_port, t_port = free_port(), free_port()
    with retrieval_server(r_port):
        t0 = time.monotonic()
        code = main(args(r_port, t_port, "--wait-s", "1.5", "--every-s", "10"))
        waited = time.monotonic() - t0
    assert code == 3
    assert 1.5 <= waited < 10
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "[wait] not answering after 2 s (the bound, --wait-s / WAIT_S): teacher "
        f"http://127.0.0.1:{t_port}/v1 (standin): not answering (connection refused)"
    )


def test_a_teacher_serving_another_model_stops_the_wait_at_once(free_port, capsys):
    r_port = free_port()
    with retrieval_server(r_port), serve_endpoint(served=["Qwen/Qwen3-8B"]) as base:
        port = int(base.rsplit(":", 1)[1].split("/")[0])
        t0 = time.monotonic()
        code = main(args(r_port, port, "--wait-s", "60", model="zai-org/GLM-4.7-Flash"))
        assert time.monotonic() - t0 < 10
    assert code == 3
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"[wait] teacher http://127.0.0.1:{port}/v1 (zai-org/GLM-4.7-Flash): serves Qwen/Qwen3-8B, "
        "standin, not zai-org/GLM-4.7-Flash; waiting will not change it"
    )


@pytest.mark.parametrize(
    "config", ["cer/configs/qwen3_4b_base_math.yaml", "eviback/configs/tiny.yaml"]
)
def test_a_config_without_services_has_nothing_to_wait_for(config, capsys):
    """CER names no service; the tiny EviBack config's teacher is the oracle and its corpus in
    process."""
    assert main(["--config", str(ROOT / config), "--wait-s", "1"]) == 0
    assert capsys.readouterr().out == f"[wait] {ROOT / config} names no service to wait for\n"
