"""What `eviback ape` pays for: the estimate printed before its first request, the cap that stops
it (exactly N requests sent, one line, exit 3) and a rerun with a higher cap that sends only the
rest. Against the rehearsal's stand-in endpoint (experiments/rehearse/endpoint.py), which answers
the controller, writer, labeller and both teacher stages by rule."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from common.api_budget import BudgetExceeded, messages_chars
from common.config import load_config
from common.retrieval.base import Doc
from eviback.ape import (
    BenchmarkRow,
    ape_requests,
    labeller_messages,
    read_policy_file,
    write_benchmark,
)
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig
from eviback.prompts import Round
from eviback.teacher import TeacherItem
from experiments.rehearse.endpoint import serve_endpoint

ROOT = Path(__file__).resolve().parents[2]


def test_ape_requests_by_hand():
    """10 dev and 4 holdout rows, 3 stage-A and 2 stage-B candidates, 2 runs; one run's stage-A
    requests over the candidates 8,000 characters, stage B 9,000; the longest candidate's holdout
    requests 3,200 (A) and 3,600 (B); 4 controller requests of 2,000 characters in all."""
    ctl, a, b = ape_requests(10, 4, 3, 2, 2, 8000, 9000, 3200, 3600, 256, 4, 2000)
    assert (ctl.calls, ctl.prompt_tokens, ctl.completion_tokens) == (4, 500, 1024)
    # stage A: 3 candidates x 2 runs x 10 rows, then the 2 selected policies on 4 rows
    assert a.calls == 3 * 2 * 10 + 2 * 4 == 68
    assert a.prompt_chars == 2 * 8000 + 2 * 3200 == 22400 and a.prompt_tokens == 5600
    assert a.completion_tokens == 68 * 256 == 17408
    # stage B: shared by every A prompt and flag: 2 candidates x 2 runs x 10 rows + 4 holdout
    assert b.calls == 2 * 2 * 10 + 4 == 44
    assert b.prompt_chars == 2 * 9000 + 3600 == 21600 and b.prompt_tokens == 5400
    assert (a.cached, b.cached) == (None, None)


def rows() -> list[BenchmarkRow]:
    """8 questions; odd ones' document names Paris (a rehearsal answer: stage A says S)."""
    out = []
    for i in range(8):
        text = f"Person {i} was born in Paris." if i % 2 else f"Person {i} was born somewhere."
        docs = (Doc(f"d{i}", f"Person {i}", text, 1.0),)
        out.append(
            BenchmarkRow(
                f"q{i}/0/1",
                f"q{i}",
                f"Where was person {i} born?",
                ("Paris",),
                (Round(f"person {i}", docs),),
                "S" if i % 2 else "I",
                "Paris" if i % 2 else "",
            )
        )
    return out


def sent(url: str) -> int:
    return httpx.get(url.removesuffix("/v1") + "/stats").json()["requests"]


def overrides(url: str, out: Path, *extra: str) -> list[str]:
    return [
        f"assets.teacher_endpoint={url}",
        "assets.teacher_model=judge",
        f"assets.controller_endpoint={url}",
        "assets.controller_model=ctl",
        f"ape.out={out}",
        "ape.candidates_a=3",
        "ape.candidates_b=2",
        "ape.written_a=1",
        "ape.written_b=1",
        "ape.gated_from_top=2",
        "ape.repeats=2",
        "teacher.backoff=0.01",
        *extra,
    ]


def setup(url: str, out: Path, *extra: str) -> EviBackConfig:
    out.mkdir(parents=True)
    write_benchmark(out / "benchmark.jsonl", rows())
    return load_config(EviBackConfig, DEFAULT_CONFIG, overrides(url, out, *extra))


@pytest.fixture(scope="module")
def endpoint():
    with serve_endpoint(served=["judge", "ctl"]) as url:
        yield url


def test_the_cap_stops_after_n_requests_and_a_rerun_pays_only_the_rest(endpoint, tmp_path, capsys):
    from eviback.ape_run import run_ape

    url = endpoint
    # --- uncapped: what the whole command sends, against the estimate printed before it
    before = sent(url)
    run_ape(setup(url, tmp_path / "full"))
    total = sent(url) - before
    out = capsys.readouterr().out
    first = re.search(r"\[eviback ape\] API estimate: <= (\d+) calls", out)
    assert first and int(first[1]) >= total, out
    assert "controller: <= 4 calls (0 already cached)" in out  # 2 id lists + 2 written texts
    known = re.search(r"API estimate of the judging, candidates known: <= (\d+) calls", out)
    assert known and int(known[1]) + 4 >= total
    assert re.search(r"teacher stage A: <= \d+ calls \(0 already cached\)", out)
    assert "[eviback ape] API spent: teacher" in out and "cap: none" in out
    policy = read_policy_file(tmp_path / "full" / "policy.yaml")
    assert total > 12

    # --- capped at 12: the 13th request is not sent
    capped = tmp_path / "capped"
    before = sent(url)
    with pytest.raises(BudgetExceeded) as stop:
        run_ape(setup(url, capped, "ape.max_api_calls=12"))
    assert sent(url) - before == 12
    assert str(stop.value).startswith("API cap ape.max_api_calls=12 reached: 12 requests sent")
    assert f"cached under {capped / 'cache'}" in str(stop.value)
    assert not (capped / "policy.yaml").exists()

    # --- a higher cap: the rest, and the same selection as the uncapped run
    capsys.readouterr()
    before = sent(url)
    cfg = load_config(
        EviBackConfig, DEFAULT_CONFIG, overrides(url, capped, "ape.max_api_calls=500")
    )
    run_ape(cfg)
    assert sent(url) - before == total - 12
    again = read_policy_file(capped / "policy.yaml")
    assert (
        again[0] == policy[0]
        and again[1]["dev"]["objective_mean"] == policy[1]["dev"]["objective_mean"]
    )
    assert "controller: <= 4 calls (4 already cached)" in capsys.readouterr().out


def test_the_labelling_estimate_counts_its_cached_requests(endpoint, tmp_path, capsys):
    from eviback.ape_run import llm_labeller
    from eviback.assets import llm_client

    cfg = load_config(EviBackConfig, DEFAULT_CONFIG, [])
    client = llm_client(endpoint, "ctl", cfg.teacher, tmp_path / "cache")
    items = [TeacherItem(r.question, r.rounds, r.golden_answers) for r in rows()[:3]]
    chars = sum(messages_chars(labeller_messages(it)) for it in items)
    label = llm_labeller(client, cap="ape.max_api_calls=9")
    before = sent(endpoint)
    label(items)
    out = capsys.readouterr().out
    assert f"labeller: <= 3 calls (0 already cached), ~{-(-chars // 4):,} prompt" in out
    assert "cap: ape.max_api_calls=9" in out
    label(items)
    assert "labeller: <= 3 calls (3 already cached)" in capsys.readouterr().out
    assert sent(endpoint) - before == 3


def test_the_ape_command_stops_with_one_line_and_exit_3(endpoint, tmp_path):
    out = tmp_path / "ape"
    setup(endpoint, out)
    before = sent(endpoint)
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    command = [
        sys.executable,
        "-m",
        "eviback",
        "ape",
        *overrides(endpoint, out, "ape.max_api_calls=5"),
    ]
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 3, run.stdout[-2000:] + run.stderr[-2000:]
    # the stop is one line of its own after the progress bar it interrupted (closed first)
    *bars, stop = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
    assert stop == (
        f"stopped: API cap ape.max_api_calls=5 reached: 5 requests sent ($0.0000); the answers "
        f"so far are cached under {out / 'cache'}: rerun with a higher cap to continue without "
        "paying for them again"
    )
    assert bars and all(b.startswith("APE stage-A prompts:") for b in bars), bars
    assert sent(endpoint) - before == 5
    assert "[eviback ape] API estimate: <= " in run.stdout
