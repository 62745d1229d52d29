"""common.api_budget: the estimate's arithmetic and text, the budget's bookkeeping, and calls made
once over a launcher's two ranks (rank 0 sends, every rank gets the answers)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, fields
from pathlib import Path

import httpx
import pytest

from common.api_budget import (
    ApiBudget,
    BudgetExceeded,
    RequestGroup,
    TokenCounter,
    check_priced,
    estimate_text,
    max_calls_field,
    max_usd_field,
    on_rank_zero,
    prices_field,
    tokens_from_chars,
    usage_text,
)
from common.launcher import RunStopped

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "api_once_over_ranks.py"


@dataclass
class Cap:
    """A config section with a command's cap, its keys made as the methods' configs make them."""

    max_api_calls: int = max_calls_field("player and annotator")
    max_api_usd: float = max_usd_field()
    player_usd_per_mtok: tuple[float, float] = prices_field("the player's")


def test_a_request_group_by_hand():
    g = RequestGroup("player", 10, 4001, 64, cached=3, prices=(0.5, 2.0))
    assert tokens_from_chars(4001) == 1001 == g.prompt_tokens  # characters / 4, rounded up
    assert g.completion_tokens == 640
    assert g.usd == pytest.approx((1001 * 0.5 + 640 * 2.0) / 1e6)


def test_the_estimate_text():
    groups = [RequestGroup("player", 10, 4000, 64, 3, (0.5, 2.0)), RequestGroup("ann", 2, 800, 100)]
    text = estimate_text("[x]", groups, "warmup.max_api_calls=5")
    assert text.splitlines() == [
        "[x] API estimate: <= 12 calls, ~2,040 tokens, <= $0.0018",  # $0.00178
        "[x]   player: <= 10 calls (3 already cached), ~1,000 prompt + <= 640 completion "
        "tokens, <= $0.0018",
        "[x]   ann: <= 2 calls, ~200 prompt + <= 200 completion tokens",
        "[x]   cap: warmup.max_api_calls=5",
    ]
    unpriced = estimate_text("[x]", groups[1:])
    assert unpriced == (
        "[x] API estimate: <= 2 calls, ~400 tokens (no prices set: no USD)\n"
        "[x]   ann: <= 2 calls, ~200 prompt + <= 200 completion tokens"
    )
    usage = {
        "requests": 3,
        "cache_hits": 1,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cost_usd": 0.5,
    }
    assert usage_text("[x]", {"t": usage}) == (
        "[x] API spent: t 3 requests (1 answered from the cache), 10 + 5 tokens, $0.5000"
    )


def test_the_budget_counts_under_threads_and_stays_stopped():
    budget = ApiBudget(max_calls=50)
    passed, refused = [], []

    def one() -> None:
        try:
            budget.reserve()
            passed.append(1)
        except BudgetExceeded:
            refused.append(1)

    threads = [threading.Thread(target=one) for _ in range(80)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(passed), len(refused), budget.sent) == (50, 30, 50)
    with pytest.raises(BudgetExceeded):
        budget.reserve()


def test_the_usd_cap_counts_spent_and_in_flight_bounds():
    budget = ApiBudget(max_usd=1.0)
    budget.reserve(0.25)
    budget.settle(0.25, 0.1)
    assert (budget.spent_usd, budget.reserved_usd) == (pytest.approx(0.1), 0.0)
    budget.reserve(0.9)  # 0.1 + 0.9 = 1.0: fits
    with pytest.raises(BudgetExceeded, match=r"max_api_usd=1 reached: \$0.1000 spent in 2"):
        budget.reserve(0.01)
    with pytest.raises(ValueError):
        ApiBudget(-1)


def test_without_a_tokenizer_a_prompt_is_bounded_by_its_bytes_and_the_template_allowance():
    """A token holds at least one byte (byte-level BPE, SentencePiece with byte fallback), and a
    chat template adds at most 64 tokens a request and 8 a message."""
    counter = TokenCounter()
    messages = [{"role": "system", "content": "Judge."}, {"role": "user", "content": "Où né ?"}]
    # 6 bytes + 9 bytes ("ù" and "é" are 2 each) + 64 + 2 x 8
    assert counter.prompt(messages) == 6 + 9 + 64 + 16 == 95
    assert counter.text("né") == 3
    assert TokenCounter("").tokenizer is None
    with pytest.raises(ValueError, match="cannot load the tokenizer"):
        TokenCounter("/no/such/tokenizer")


def test_no_cap_never_stops():
    budget = ApiBudget()
    for _ in range(1000):
        budget.reserve(5.0)
    assert budget.sent == 1000 and not budget.capped


def test_in_one_process_on_rank_zero_is_the_call():
    assert on_rank_zero(lambda: 7) == 7
    with pytest.raises(RunStopped, match="cap"):
        on_rank_zero(lambda: (_ for _ in ()).throw(RunStopped("cap")))


def test_two_ranks_pay_once_and_stop_together(tmp_path, launch_two_ranks):
    """Rank 0 sends 4 requests, both ranks get the 4 answers (not 8 requests); a cap of 2 stops
    both ranks with rank 0's message after 2 requests; rank 0's error reaches rank 1."""
    from experiments.rehearse.endpoint import serve_endpoint

    with serve_endpoint() as url:
        run = launch_two_ranks(
            [str(SCRIPT), "--url", url, "--cache", str(tmp_path / "cache")],
            torchrun=True,
            timeout=120,
        )
        requests = httpx.get(url.removesuffix("/v1") + "/stats").json()["requests"]
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    got = dict(re.findall(r"^rank (\d): all ok (.*)$", out, flags=re.M))
    assert set(got) == {"0", "1"} and got["0"] == got["1"] and "Search[" in got["0"], out
    stopped = re.findall(r"^rank (\d): capped stopped (.*)$", out, flags=re.M)
    assert sorted(r for r, _ in stopped) == ["0", "1"], out
    assert {m for _, m in stopped} == {"API cap max_api_calls=2 reached: 2 requests sent ($0.0000)"}
    assert requests == 4 + 2  # not twice that
    assert "rank 0: error failed ValueError: the teacher's data is broken" in out
    assert (
        "rank 1: error failed RuntimeError: rank 0 failed in the calls made for every rank: "
        "ValueError: the teacher's data is broken" in out
    )


def test_a_sections_budget_names_its_keys_in_the_cap_line_and_the_stop(tmp_path):
    budget = ApiBudget.for_section("ape", Cap(3, 0.0), tmp_path / "cache")
    assert budget.describe() == "ape.max_api_calls=3"
    usd = ApiBudget.for_section("warmup", Cap(0, 2.5), tmp_path)
    assert usd.describe() == "warmup.max_api_usd=2.5"
    assert ApiBudget.for_section("warmup", Cap(0, 0.0), tmp_path).describe() == (
        "none (warmup.max_api_calls, warmup.max_api_usd)"
    )
    for _ in range(3):
        budget.reserve()
    with pytest.raises(BudgetExceeded, match=r"ape\.max_api_calls") as stop:
        budget.reserve()
    assert f"cached under {tmp_path / 'cache'}" in str(stop.value)


def test_the_cap_fields_default_to_no_cap_and_say_what_they_count():
    cap = Cap()
    assert (cap.max_api_calls, cap.max_api_usd, cap.player_usd_per_mtok) == (0, 0.0, (0.0, 0.0))
    helps = {f.name: f.metadata["help"] for f in fields(Cap)}
    assert helps["max_api_calls"] == (
        "stop (exit 3) before the request that would pass this many paid requests (player and "
        "annotator together, retries included, cached answers free); 0: no cap"
    )
    assert helps["max_api_usd"].endswith("(needs the prices below); 0: no cap")
    assert helps["player_usd_per_mtok"] == (
        "the player's USD per million (prompt, completion) tokens"
    )
    assert {f.metadata["ge"] for f in fields(Cap)} == {0}


def test_a_dollar_cap_without_a_price_is_refused_naming_the_price_keys():
    prices = {"teacher_usd_per_mtok": (0.0, 0.0), "controller_usd_per_mtok": (0.0, 0.0)}
    with pytest.raises(ValueError) as err:
        check_priced("ape", 2.5, prices)
    assert str(err.value) == (
        "ape.max_api_usd=2.5 needs prices: set ape.teacher_usd_per_mtok and "
        "ape.controller_usd_per_mtok"
    )
    check_priced("ape", 0.0, prices)  # no dollar cap: no price needed
    check_priced("ape", 2.5, {**prices, "controller_usd_per_mtok": (0.0, 0.6)})  # one price
