"""E2E-APE's pure parts: benchmark, split, metrics on hand-made confusions, selection, policy file."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import yaml

from common.data import QAExample
from common.retrieval.base import Doc
from common.rollout.trajectory import Step, Trajectory
from eviback.ape import (
    BenchmarkRow,
    build_benchmark,
    candidate_result,
    diagnostics,
    gated_policies,
    judge_metrics,
    label_rollouts,
    labeller_messages,
    largest_remainder,
    read_benchmark,
    read_policy_file,
    results_table,
    select_best,
    split_by_question,
    split_by_step,
    status_agreement,
    write_benchmark,
    write_policy_file,
)
from eviback.oracle import EvidenceOracle
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round, TeacherPrompt, get_prompt
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
        (("S", "A"), True),
        (("S", "A"), False),
        (("S",), True),
        (("S",), False),
    }


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


# --- paper scale: FlashRAG rows, questions without supporting facts, step strata, diagnostics ---


def test_flashrag_rows_keep_their_supporting_titles(tmp_path):
    """FlashRAG keeps HotpotQA's / 2Wiki's supporting facts (columnar or pairs) and MuSiQue's
    paragraphs in ``metadata``; the loader turns them into ``supporting_titles``; NQ has none."""
    from common.data import DataError, load_qa

    rows = [
        {
            "id": "h0",
            "question": "Q0?",
            "golden_answers": ["a"],
            "metadata": {
                "type": "bridge",
                "supporting_facts": {"title": ["T1", "T2", "T1"], "sent_id": [0, 1, 2]},
                "context": {"title": ["T1", "T2"], "sentences": [["x."], ["y."]]},
            },
        },
        {
            "id": "w0",
            "question": "Q1?",
            "golden_answers": ["b"],
            "metadata": {"supporting_facts": [["U1", 0], ["U2", 3]]},
        },
        {
            "id": "m0",
            "question": "Q2?",
            "golden_answers": ["c"],
            "metadata": {
                "paragraphs": [
                    {"idx": 0, "title": "V1", "paragraph_text": "v1", "is_supporting": False},
                    {"idx": 1, "title": "V2", "paragraph_text": "v2", "is_supporting": True},
                ]
            },
        },
        {"id": "n0", "question": "Q3?", "golden_answers": ["d"], "metadata": {}},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_qa(path, source="s")
    assert [ex.metadata.get("supporting_titles") for ex in got] == [
        ["T1", "T2"],
        ["U1", "U2"],
        ["V2"],
        None,
    ]
    assert got[0].metadata["type"] == "bridge"  # the rest of the metadata stays
    bad = {**rows[0], "metadata": {"supporting_facts": {"title": "T1"}}}
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=r"line 1: field 'metadata.supporting_facts.title'"):
        load_qa(path, source="s")


NQ = QAExample("nq:1", "Where is Zuro?", ["Zuro"], {})


def test_label_rollouts_uses_the_oracle_where_it_can_and_counts_the_rest():
    examples = {"q1": EXAMPLE, "nq:1": NQ}
    trajs = [
        traj(0, [("lanterns", [FILM, PERSON])]),
        traj(0, [("zuro", [OTHER])], "nq:1"),
        traj(1, [("zuro city", [FILM])], "nq:1"),
    ]
    oracle = EvidenceOracle(5).label
    rows, counts = label_rollouts(trajs, examples, oracle)
    assert [(r.question_id, r.label) for r in rows] == [("q1", "S")]
    assert counts == {
        "questions_oracle": 1,
        "questions_without_facts": 1,
        "rows_oracle": 1,
        "rows_llm": 0,
        "rows_llm_invalid": 0,
        "questions_left_out": 1,
    }
    asked = []

    def llm(items):  # S where the evidence names Zuro, else a contract breach
        asked.extend(items)
        return [
            Verdict(True, "S", "Zuro")
            if "Zuro" in it.rounds[0].docs[0].text
            else Verdict(False, None, error="parse")
            for it in items
        ]

    rows, counts = label_rollouts(trajs, examples, oracle, llm)
    assert [(r.row_id, r.label, r.label_answer) for r in rows] == [
        ("q1/0/1", "S", "Tamsford"),
        ("nq:1/0/1", "S", "Zuro"),
    ]
    assert (counts["rows_llm"], counts["rows_llm_invalid"], counts["questions_left_out"]) == (
        1,
        1,
        0,
    )
    assert len(asked) == 2 and list(asked[0].references) == ["Zuro"]
    with pytest.raises(ValueError, match="unknown question 'q1'"):
        label_rollouts(trajs[::-1], {"nq:1": NQ}, oracle)
    text = labeller_messages(asked[0])[0]["content"]
    assert "Question: Where is Zuro?" in text and "Reference answers: Zuro" in text
    assert "Doc 1 (Title: Zuro) Zuro is a city." in text


def row(qid: str, steps: int, label: str) -> BenchmarkRow:
    rounds = tuple(Round(f"q{k}", (OTHER,)) for k in range(steps))
    return BenchmarkRow(
        f"{qid}/0/{steps}", qid, f"{qid}?", ("x",), rounds, label, "x" if label == "S" else ""
    )


def test_largest_remainder_quotas():
    # 10 · (5, 3, 2) / 10 = (5, 3, 2); 4 · (5, 3, 2) / 10 = (2.0, 1.2, 0.8) -> (2, 1, 1)
    assert largest_remainder({"S": 5, "I": 3, "A": 2}, 10) == {"S": 5, "I": 3, "A": 2}
    assert largest_remainder({"S": 5, "I": 3, "A": 2}, 4) == {"S": 2, "I": 1, "A": 1}
    assert largest_remainder({"S": 1, "I": 1, "A": 1}, 2) == {"S": 1, "I": 1, "A": 0}
    assert largest_remainder({"S": 0, "I": 0, "A": 0}, 3) == {"S": 0, "I": 0, "A": 0}


def test_holdout_is_stratified_by_search_step_with_label_quotas():
    """One row per question (as the release's benchmark): step 1 holds 10 rows (S 6, I 4), step
    2 holds 5 (S 1, I 4). With 40%: step 1 quota 4 = S 2.4 -> 2, I 1.6 -> 2 (largest remainder);
    step 2 quota 2 = S 0.4, I 1.6 -> S 0, I 2."""
    rows = [row(f"a{i}", 1, "S" if i < 6 else "I") for i in range(10)]
    rows += [row(f"b{i}", 2, "S" if i < 1 else "I") for i in range(5)]
    for seed in range(5):
        dev, holdout = split_by_step(rows, 0.4, seed)
        assert {r.question_id for r in dev}.isdisjoint(r.question_id for r in holdout)
        assert len(dev) + len(holdout) == 15
        strata = Counter((len(r.rounds), r.label) for r in holdout)
        assert (strata[1, "S"], strata[1, "I"], strata[2, "S"], strata[2, "I"]) == (2, 2, 0, 2)
    assert split_by_step(rows, 0.4, 1) == split_by_step(rows, 0.4, 1)
    assert split_by_step(rows, 0.4, 1) != split_by_step(rows, 0.4, 2)


def test_diagnostics_lists_confusion_coverage_and_missed_i():
    rows = [row("s1", 1, "S"), row("s2", 1, "S"), row("i1", 1, "I"), row("i2", 1, "I")]
    verdicts = [
        Verdict(True, "S", "x"),
        Verdict(True, "I"),
        Verdict(True, "S", "y"),
        Verdict(False, None, error="parse"),
    ]
    text = diagnostics(rows, verdicts)
    assert "| S | 1 | 1 | 0 | 0 |" in text and "| I | 1 | 0 | 0 | 1 |" in text
    assert "Gold coverage on gold-S rows: 0.5000" in text
    assert "- `s1/0/1` gold ['x']: teacher S 'x' (F1 1.00)" in text
    assert "Missed I (2)" in text and "- `i1/0/1` (i1?): teacher S 'y'" in text
    assert "- `i2/0/1` (i2?): teacher invalid ''" in text
    assert "False I (1)" in text and "- `s2/0/1` gold S (s2?)" in text


def test_policy_file_carries_controller_written_instructions(tmp_path):
    """A policy whose stage A is a controller-written instruction stores the text; reading it in
    a process that never saw the text registers it again; a changed text is refused."""
    from eviback.prompts import INSTRUCTIONS, register_instruction

    text = "Only the documents count; say insufficient when a link is missing. Test text."
    name = register_instruction("A", text)
    assert name == register_instruction("A", "  " + text + "\n")  # the same text, the same name
    assert name.startswith("ctl_") and len(name) == 14 and name[4:].isalpha()
    prompt = TeacherPrompt("A", name)
    assert text in prompt.text and get_prompt(prompt.id) == prompt
    policy = TeacherPolicy(prompt.id, STAGE_B_DEFAULT.id)
    path = tmp_path / "policy.yaml"
    write_policy_file(path, policy, {"dev": 1.0})
    assert yaml.safe_load(path.read_text())["written_instructions"] == {f"A:{name}": text}
    del INSTRUCTIONS["A"][name]  # as in a new process
    with pytest.raises(ValueError, match="unknown stage-A instruction"):
        get_prompt(prompt.id)
    assert read_policy_file(path)[0] == policy and INSTRUCTIONS["A"][name] == text
    data = yaml.safe_load(path.read_text())
    data["written_instructions"][f"A:{name}"] = text + " Changed."
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="the text does not match its name"):
        read_policy_file(path)
