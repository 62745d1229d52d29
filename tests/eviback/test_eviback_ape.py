"""E2E-APE's pure parts: benchmark, split, metrics on hand-made confusions, selection, policy file."""

from __future__ import annotations

import json

import pytest
import yaml

from common.data import QAExample
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.ape import (
    BenchmarkRow,
    build_benchmark,
    candidate_result,
    gated_policies,
    judge_metrics,
    read_benchmark,
    read_policy_file,
    results_table,
    select_best,
    split_by_question,
    status_agreement,
    write_benchmark,
    write_policy_file,
)
from eviback.oracle import EvidenceOracle
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round, TeacherPrompt
from eviback.teacher import TeacherPolicy, TeacherStats, Verdict

FILM = Doc("film-1", "Lanterns", "Lanterns is a film directed by Ora Velk.", 2.0)
PERSON = Doc("person-1", "Ora Velk", "Ora Velk was born in Tamsford.", 1.0)
OTHER = Doc("city-9", "Zuro", "Zuro is a city.", 0.5)
EXAMPLE = QAExample(
    "q1",
    "Where was the director of Lanterns born?",
    ["Tamsford"],
    {"supporting_ids": ["film-1", "person-1"]},
)


def traj(sample, rounds, question_id="q1"):
    t = Trajectory(question_id, sample, question_id, "Q?", ["Tamsford"], [1])
    t.steps = [Step("search", i, i + 1, query=q, docs=list(d)) for i, (q, d) in enumerate(rounds)]
    return t


# --- benchmark -------------------------------------------------------------------------------


def test_build_benchmark_cuts_at_search_steps_labels_and_dedupes():
    trajs = [
        traj(0, [("Lanterns", [FILM]), ("Ora Velk", [PERSON])]),
        traj(1, [("Lanterns", [FILM]), ("Zuro", [OTHER])]),  # same first round: deduped
        traj(2, []),  # no search, no row
    ]
    rows = build_benchmark(trajs, {"q1": EXAMPLE}, EvidenceOracle().label)
    assert [(r.row_id, r.label, r.label_answer) for r in rows] == [
        ("q1/0/1", "I", ""),
        ("q1/0/2", "S", "Tamsford"),
        ("q1/1/2", "I", ""),
    ]
    assert rows[1].rounds == (Round("Lanterns", (FILM,)), Round("Ora Velk", (PERSON,)))
    assert rows[1].item().references == ("Tamsford",)


def test_build_benchmark_errors():
    with pytest.raises(ValueError, match="unknown question 'q2'"):
        build_benchmark([traj(0, [("x", [FILM])], "q2")], {"q1": EXAMPLE}, EvidenceOracle().label)
    with pytest.raises(ValueError, match="invalid verdict"):
        build_benchmark(
            [traj(0, [("x", [FILM])])],
            {"q1": EXAMPLE},
            lambda item: Verdict(False, None, error="e"),
        )


def test_benchmark_file_round_trip_and_bad_rows(tmp_path):
    rows = build_benchmark(
        [traj(0, [("Lanterns", [FILM, OTHER]), ("Ora Velk", [PERSON])])],
        {"q1": EXAMPLE},
        EvidenceOracle().label,
    )
    path = tmp_path / "bench.jsonl"
    write_benchmark(path, rows)
    assert read_benchmark(path) == rows
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["label"]
    path.write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"bench.jsonl:2: missing field 'label'"):
        read_benchmark(path)
    path.write_text(lines[0].replace('"label": "I"', '"label": "X"') + "\n")
    with pytest.raises(ValueError, match=r":1: field 'label' must be S, I or A"):
        read_benchmark(path)
    path.write_text("{oops\n")
    with pytest.raises(ValueError, match=":1: invalid JSON"):
        read_benchmark(path)


def rows_for(labels, question_ids=None):
    question_ids = question_ids or [f"q{i}" for i in range(len(labels))]
    return [
        BenchmarkRow(f"r{i}", qid, "Q?", ("Ora Velk",), (), label)
        for i, (label, qid) in enumerate(zip(labels, question_ids, strict=True))
    ]


def test_split_is_by_question_seeded_and_complete():
    rows = rows_for(["S"] * 30, [f"q{i // 3}" for i in range(30)])  # 10 questions, 3 rows each
    dev, holdout = split_by_question(rows, 0.3, seed=1)
    dev_q, hold_q = {r.question_id for r in dev}, {r.question_id for r in holdout}
    assert not dev_q & hold_q and len(hold_q) == 3 and len(dev) + len(holdout) == 30
    assert (dev, holdout) == split_by_question(rows, 0.3, seed=1)
    assert {r.question_id for r in split_by_question(rows, 0.3, seed=2)[1]} != hold_q
    with pytest.raises(ValueError, match="holdout_fraction"):
        split_by_question(rows, 1.0)
    with pytest.raises(ValueError, match="at least 2 questions"):
        split_by_question(rows_for(["S", "I"], ["q", "q"]))


# --- metrics ---------------------------------------------------------------------------------


def v(status, answer=""):
    return Verdict(True, status, answer, "r") if status else Verdict(False, None, error="parse: x")


LABELS = ["S", "S", "S", "I", "I", "I", "A"]
VERDICTS = [v("S", "Ora Velk"), v("S", "Velk"), v("I"), v("I"), v("S", "x"), v(None), v("I")]


def test_judge_metrics_on_a_hand_made_confusion():
    m = judge_metrics(rows_for(LABELS), VERDICTS)
    assert m.confusion == {
        "S": {"S": 2, "I": 1, "A": 0, "invalid": 0},
        "I": {"S": 1, "I": 1, "A": 0, "invalid": 1},
        "A": {"S": 0, "I": 1, "A": 0, "invalid": 0},
    }
    # predicted I: 3, of which 1 gold I; gold I: 3
    assert (m.i_precision, m.i_recall, m.i_f1) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert m.gold_f1_coverage == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert m.parse_rate == pytest.approx(6 / 7)
    assert m.objective == pytest.approx(0.5 / 3 + 0.5 * 5 / 9)
    assert judge_metrics(rows_for(LABELS), VERDICTS, (1.0, 0.0)).objective == pytest.approx(1 / 3)


def test_judge_metrics_perfect_and_degenerate():
    perfect = [v("S", "Ora Velk"), v("I"), v("A")]
    m = judge_metrics(rows_for(["S", "I", "A"]), perfect)
    assert (m.i_precision, m.i_recall, m.i_f1, m.gold_f1_coverage, m.objective) == (1, 1, 1, 1, 1)
    # no I predicted and no gold S: the undefined ratios are 0
    m = judge_metrics(rows_for(["I", "A"]), [v("A"), v("A")])
    assert (m.i_precision, m.i_recall, m.i_f1, m.gold_f1_coverage) == (0, 0, 0, 0)
    # an S answer on a gold-S row counts only from a valid S verdict
    assert judge_metrics(rows_for(["S"]), [v("A")]).gold_f1_coverage == 0
    with pytest.raises(ValueError, match="2 verdicts for 1"):
        judge_metrics(rows_for(["S"]), [v("I"), v("I")])


def test_status_agreement():
    r1 = [v("S", "a"), v("I"), v(None), v("A")]
    r2 = [v("S", "b"), v("I"), v(None), v("I")]  # answer differs (status same), last differs
    assert status_agreement([r1, r2]) == pytest.approx(3 / 4)
    assert status_agreement([r1]) == 1.0
    with pytest.raises(ValueError):
        status_agreement([r1, r2[:2]])


# --- selection and the policy file -----------------------------------------------------------


def cost(tokens):
    return TeacherStats(items=7, calls_a=7, prompt_tokens=tokens, latency_s=1.0)


SINGLE_A = TeacherPolicy(STAGE_A_DEFAULT.id)
SINGLE_B = TeacherPolicy(TeacherPrompt("A", "strict").id)
GATED = gated_policies([STAGE_A_DEFAULT.id], [STAGE_B_DEFAULT.id])


def test_gated_policies_cover_the_flags():
    assert len(GATED) == 4
    assert {(p.gate, p.canonicalize) for p in GATED} == {
        (("S", "A"), True), (("S", "A"), False), (("S",), True), (("S",), False)
    }  # fmt: skip


PERFECT = [v("S", "Ora Velk")] * 3 + [v("I")] * 3 + [v("A")]
HALF = [v("A")] * 3 + [v("I")] * 3 + [v("A")]  # I-F1 1, coverage 0: objective 0.5
HALF_UNPARSED = HALF[:-1] + [v(None)]  # the gold-A row invalid: same objective, lower parse rate


def test_select_best_by_mean_objective():
    rows = rows_for(LABELS)
    weak = candidate_result(SINGLE_A, rows, [VERDICTS], [cost(10)])  # 4/9
    strong = candidate_result(SINGLE_B, rows, [PERFECT], [cost(900)])  # 1
    gated_half = candidate_result(GATED[0], rows, [HALF], [cost(5)])  # 0.5
    gated_weak = candidate_result(GATED[1], rows, [VERDICTS], [cost(1)])
    selection = select_best([weak, strong, gated_weak, gated_half])
    assert (selection.single, selection.gated, selection.best) == (strong, gated_half, strong)
    assert select_best([gated_weak]).single is None
    with pytest.raises(ValueError, match="no candidate"):
        select_best([])


def test_select_best_ties_go_to_stability_then_parse_rate_then_tokens():
    rows = rows_for(LABELS)
    steady = candidate_result(GATED[0], rows, [HALF, HALF], [cost(9), cost(9)])
    swings = candidate_result(GATED[1], rows, [PERFECT, [v(None)] * 7], [cost(1), cost(1)])
    assert swings.summary()["objective_mean"] == steady.summary()["objective_mean"] == 0.5
    assert select_best([swings, steady]).gated is steady  # worst run 0.5 beats 0
    unparsed = candidate_result(GATED[2], rows, [HALF_UNPARSED] * 2, [cost(1), cost(1)])
    assert select_best([unparsed, steady]).gated is steady  # parse 1 beats 6/7
    cheap = candidate_result(GATED[3], rows, [HALF, HALF], [cost(5), cost(3)])
    assert select_best([steady, cheap]).gated is cheap  # 4 tokens a run beat 9
    s = swings.summary()
    assert (s["objective_min"], s["objective_max"], s["agreement"]) == (0.0, 1.0, 0.0)
    assert (s["tokens"], s["calls"], s["latency_s"], s["parse_rate"]) == (1, 7, 1.0, 0.5)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_policy_file_round_trip(tmp_path, suffix):
    path = tmp_path / f"teacher_policy{suffix}"
    write_policy_file(path, GATED[2], {"dev": {"objective": 0.5}, "holdout": {"objective": 0.4}})
    policy, scores = read_policy_file(path)
    assert policy == GATED[2]
    assert scores == {"dev": {"objective": 0.5}, "holdout": {"objective": 0.4}}
    data = yaml.safe_load(path.read_text())
    assert data["stage_a"] == {"id": STAGE_A_DEFAULT.id, "hash": STAGE_A_DEFAULT.hash}
    assert data["strategy_id"] == GATED[2].strategy_id and data["gate"] == ["S"]


def test_single_stage_policy_file(tmp_path):
    path = tmp_path / "p.yml"
    write_policy_file(path, SINGLE_B, {})
    assert read_policy_file(path) == (SINGLE_B, {})
    assert yaml.safe_load(path.read_text())["stage_b"] is None


def test_policy_file_refuses_changed_prompts_and_bad_files(tmp_path):
    path = tmp_path / "p.json"
    write_policy_file(path, GATED[0], {})
    data = json.loads(path.read_text())
    data["stage_b"]["hash"] = "000000000000"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"stage_b prompt .* changed since the policy was frozen"):
        read_policy_file(path)
    write_policy_file(path, GATED[0], {})
    data = json.loads(path.read_text())
    data["strategy_id"] = "single:x"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="strategy_id 'single:x' does not match"):
        read_policy_file(path)
    del data["gate"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="missing key 'gate'"):
        read_policy_file(path)
    data = {**json.loads(path.read_text()), "gate": ["S"], "stage_a": {"id": "nope", "hash": "x"}}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="stage_a: unknown prompt id 'nope'"):
        read_policy_file(path)
    with pytest.raises(ValueError, match="ends in .yaml"):
        write_policy_file(tmp_path / "p.txt", GATED[0], {})


def test_results_table_lists_best_first():
    rows = rows_for(LABELS)
    weak = candidate_result(SINGLE_A, rows, [VERDICTS], [cost(10)])
    strong = candidate_result(SINGLE_B, rows, [PERFECT], [cost(20)])
    lines = results_table([weak, strong]).splitlines()
    assert len(lines) == 4 and lines[0].startswith("| strategy |")
    assert SINGLE_B.strategy_id in lines[2] and "1.0000 (1.0000–1.0000)" in lines[2]
    assert SINGLE_A.strategy_id in lines[3] and "0.4444" in lines[3]
