"""What ARCO's LLM warmup pays for: the estimate printed before the first request, the cap that
stops it (exactly N requests sent, a rerun sends only the rest) and the shared request-keyed cache
(a second backbone on the same data pays nothing when it shares the tokenizer). Against the
rehearsal's stand-in OpenAI-compatible endpoint (experiments/rehearse/endpoint.py), which answers
the player and annotator contracts by rule."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from arco import warmup
from arco.config import ArcoConfig
from arco.environment import build_environment
from arco.teacher import teacher_policy_messages, warmup_estimate, warmup_requests
from common.api_budget import BudgetExceeded, messages_chars
from common.config import load_config
from common.data import load_qa
from common.launcher import RunStopped
from experiments.rehearse.endpoint import serve_endpoint

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
SAMPLE = ROOT / "tests" / "data" / "retrieval" / "hotpotqa_distractor_sample.jsonl"
# One sample a question: the stand-in plays a question's samples alike, and two identical
# episodes share one annotation request (whichever comes back first answers the other from the
# cache), which would make the counts depend on thread timing.
QUESTIONS, SAMPLES, MAX_SEARCHES = 6, 1, 3


def test_warmup_requests_by_hand():
    """2 questions (first prompts 100 + 200 characters), 3 samples, 2 searches, a turn adds at
    most 50 characters, annotation prompts 400 + 600 characters."""
    player, annotator = warmup_requests(2, 3, 2, 300, 50, 1000, 64, 384)
    assert player.calls == 2 * 3 * 3 == 18
    # 3 samples x [3 turns x 300 + 2 questions x 50 x (0 + 1 + 2)] = 3 x (900 + 300)
    assert player.prompt_chars == 3600 and player.prompt_tokens == 900
    assert player.completion_tokens == 18 * 64 == 1152
    assert annotator.calls == 6 and annotator.prompt_chars == 3000
    assert annotator.prompt_tokens == 750 and annotator.completion_tokens == 6 * 384 == 2304
    priced = type(player)("p", 18, 3600, 64, prices=(0.15, 0.6))
    assert priced.usd == pytest.approx((900 * 0.15 + 1152 * 0.6) / 1e6) == pytest.approx(8.262e-4)
    # no search budget: one turn (the forced one) an episode
    p0, _ = warmup_requests(1, 1, 0, 120, 50, 500, 64, 128)
    assert (p0.calls, p0.prompt_chars) == (1, 120)


def stats(url: str) -> dict:
    return httpx.get(url.removesuffix("/v1") + "/stats").json()["by_contract"]


def sent(url: str) -> dict[str, int]:
    by = stats(url)
    return {c: sum(by[c].values()) for c in ("arco_player", "arco_annotator")}


def config(url: str, cache: Path, *extra: str) -> ArcoConfig:
    over = [
        f"assets.train={SAMPLE}",
        f"assets.teacher_endpoint={url}",
        "assets.teacher_model=player",
        f"assets.annotator_endpoint={url}",
        "assets.annotator_model=annotator",
        f"warmup.api_cache_dir={cache}",
        "env.setting=distractor",
        f"env.max_searches={MAX_SEARCHES}",
        "agent.instruction=''",
        "warmup.teacher=llm",
        f"warmup.samples={SAMPLES}",
        "warmup.teacher_backoff_s=0.01",
        *extra,
    ]
    return load_config(ArcoConfig, CONFIG, over)


def collect(cfg: ArcoConfig, tokenizer):
    retriever, agent = build_environment(cfg.env, cfg.agent)
    examples = load_qa(SAMPLE)[:QUESTIONS]
    return warmup.collect_llm(cfg, tokenizer, retriever, agent, examples, warmup.teacher_cache(cfg))


@pytest.fixture(scope="module")
def endpoint():
    with serve_endpoint(served=["player", "annotator"]) as url:
        yield url


def test_the_cap_stops_after_n_requests_and_a_rerun_pays_only_the_rest(
    tiny_world, tmp_path, endpoint, capsys
):
    from transformers import AutoTokenizer

    url, tok = endpoint, AutoTokenizer.from_pretrained(tiny_world / "model")
    # --- uncapped, its own cache: what the whole collection sends
    before = sent(url)
    full = collect(config(url, tmp_path / "full"), tok)
    whole = {c: n - before[c] for c, n in sent(url).items()}
    total = sum(whole.values())
    out = capsys.readouterr().out
    # the estimate, before the first request: an upper bound on the calls sent
    est = re.search(r"\[arco warmup\] API estimate: <= (\d+) calls", out)
    player = re.search(r"player: <= (\d+) calls \((\d+) already cached\)", out)
    assert est and player, out
    assert int(player[1]) == QUESTIONS * SAMPLES * (MAX_SEARCHES + 1) >= whole["arco_player"]
    assert int(est[1]) == int(player[1]) + QUESTIONS * SAMPLES >= total
    assert int(player[2]) == 0
    assert "cap: none" in out and "[arco warmup] API spent: player" in out
    assert whole["arco_annotator"] == QUESTIONS * SAMPLES and total > 8

    # --- capped at 8: stopped before the 9th request, with one line saying what to do
    cache = tmp_path / "capped"
    before = sent(url)
    with pytest.raises(BudgetExceeded) as stop:
        collect(config(url, cache, "warmup.max_api_calls=8"), tok)
    assert sum(sent(url).values()) - sum(before.values()) == 8
    message = str(stop.value)
    assert "\n" not in message and isinstance(stop.value, RunStopped)
    assert message.startswith("API cap warmup.max_api_calls=8 reached: 8 requests sent")
    assert f"cached under {cache}" in message and "rerun with a higher cap" in message
    assert len(list(cache.rglob("*.json"))) == 8  # every answer that came back is kept

    # --- a higher cap: only the rest goes out, and the result is the uncapped one's
    capsys.readouterr()
    before = sent(url)
    again = collect(config(url, cache, "warmup.max_api_calls=1000"), tok)
    assert sum(sent(url).values()) - sum(before.values()) == total - 8
    assert "cap: warmup.max_api_calls=1000" in capsys.readouterr().out
    assert again[1] == full[1] and again[2] == full[2]  # episodes and annotations
    assert again[3]["player_usage"]["cache_hits"] + again[3]["annotator_usage"]["cache_hits"] == 8


def test_a_second_backbone_on_the_same_data_pays_nothing(
    tiny_world, tmp_path, endpoint, capsys, qwen3_tokenizer
):
    """The player's prompts carry the question and the observations the agent would see, cut at
    ``agent.max_obs_tokens`` of the backbone's tokenizer; nothing else of the backbone. Another
    backbone with the same tokenizer (a copy of the folder under another name) sends 0 requests;
    one with another tokenizer (Qwen3's) reuses the first turns and every request whose
    observations come out the same, and sends the rest."""
    from transformers import AutoTokenizer

    url, cache = endpoint, tmp_path / "shared"
    tiny_tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    first = collect(config(url, cache, f"assets.model={tiny_world / 'model'}"), tiny_tok)
    other = tmp_path / "another-backbone"
    shutil.copytree(tiny_world / "model", other)
    capsys.readouterr()
    before = sent(url)
    cfg = config(url, cache, f"assets.model={other}", f"warmup_dir={tmp_path / 'w2'}")
    second = collect(cfg, AutoTokenizer.from_pretrained(other))
    assert sent(url) == before  # 0 player, 0 annotator requests
    assert second[1] == first[1] and second[2] == first[2]
    out = capsys.readouterr().out
    assert f"player: <= 24 calls ({QUESTIONS * SAMPLES} already cached)" in out
    assert tiny_tok.vocab_size != qwen3_tokenizer.vocab_size

    # another tokenizer: the first turns replay, requests after a differently cut observation
    # go out again
    third = collect(config(url, cache), qwen3_tokenizer)
    after = sent(url)
    usage = third[3]["player_usage"]
    assert usage["cache_hits"] >= QUESTIONS * SAMPLES  # every first turn at least
    assert after["arco_player"] - before["arco_player"] == usage["requests"]
    assert usage["requests"] > 0  # the tiny tokenizer cut some paragraphs Qwen3's does not


def test_warmup_estimate_counts_cached_first_turns(tmp_path):
    """The estimate's player prompt characters start from the real first prompts; cached counts
    the first turns whose answer is on disk (the key is computed before any request)."""
    from common.llm_client import ChatResult, LLMClient

    examples = load_qa(SAMPLE)[:2]
    player = LLMClient("http://127.0.0.1:9/v1", "p", cache_dir=tmp_path / "p", max_tokens=64)
    annotator = LLMClient("http://127.0.0.1:9/v1", "a", cache_dir=tmp_path / "a", max_tokens=256)
    firsts = [teacher_policy_messages(ex.question, [], 1) for ex in examples]
    player._cache_write(player.cache_key(firsts[1], "seed0|sample=1"), ChatResult("x", None))
    p, a = warmup_estimate(player, annotator, examples, 2, 1, 3, 10, cache_tag="seed0")
    turn = len("x" * 256 + "\nObservation: " + "x" * 40 + "\n")
    first_chars = sum(messages_chars(m) for m in firsts)
    assert p.calls == 2 * 2 * 2 and p.cached == 1
    assert p.prompt_chars == 2 * (2 * first_chars + 2 * turn * 1)
    assert p.prompt_tokens == math.ceil(p.prompt_chars / 4)
    assert (a.calls, a.max_tokens, a.cached) == (4, 256, None)
    assert a.prompt_chars > 2 * (2 * 256 + 40)  # two steps of the longest action, one observation


@pytest.mark.slow
def test_the_warmup_command_stops_with_one_line_and_exit_3(tiny_world, tmp_path, endpoint):
    """`python -m arco warmup` with warmup.max_api_calls: exit 3, one line on stderr, the
    estimate printed before the first request."""
    before = sent(endpoint)
    over = [
        f"assets.model={tiny_world / 'model'}",
        f"assets.train={SAMPLE}",
        f"assets.teacher_endpoint={endpoint}",
        "assets.teacher_model=player",
        f"assets.annotator_endpoint={endpoint}",
        "assets.annotator_model=annotator",
        f"warmup.api_cache_dir={tmp_path / 'cache'}",
        f"warmup_dir={tmp_path / 'w'}",
        "env.setting=distractor",
        "agent.instruction=''",
        "engine.backend=hf",
        "warmup.teacher=llm",
        "warmup.questions=4",
        "warmup.select_questions=2",
        "warmup.max_api_calls=5",
    ]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "arco", "warmup", "--config", str(CONFIG), *over],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [x for x in run.stderr.splitlines() if x.strip() and "Warning" not in x]
    assert lines[-1].startswith("stopped: API cap warmup.max_api_calls=5 reached: 5 requests")
    assert sum(sent(endpoint).values()) - sum(before.values()) == 5
    assert "[arco warmup] API estimate: <= " in run.stdout
    assert "cap: warmup.max_api_calls=5" in run.stdout
