"""ARCO's warmup from the release's warmup data (``warmup.teacher=file``): records written as the
release's ``src/training/warmup_collect.py`` writes them (``_process_one_api``'s loop and record
dict, its HotpotQA environment's observations), read into episodes and annotations; then a
whole warmup on them with no request. The release's own file is not in its public snapshot:
these records are built here, in its writer's format, on the tiny distractor sample."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from arco import warmup
from arco.config import ArcoConfig
from arco.release_import import import_release
from arco.teacher import INVALID_OBSERVATION
from common.config import load_config
from common.data import load_qa
from common.train.plain_state import load_plain

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
SAMPLE = ROOT / "tests" / "data" / "retrieval" / "hotpotqa_distractor_sample.jsonl"
RAW = [json.loads(line) for line in SAMPLE.open()]
ROWS = load_qa(SAMPLE)
MAX_STEPS, K = 3, 3


def release_record(row: int, sample: int, outputs: list[tuple[str, bool]], reward: float) -> dict:
    """A record as the release's ``_process_one_api`` builds it: its loop over the policy's
    (action, valid_parse) turns, forced finish once the budget is spent, its HotpotQA env's
    observations (a search: the top-1 paragraph, ``"".join(sentences)``; here the paragraph
    whose title is the query, standing in for SimCSE), and K criteria and scores a step."""
    example = RAW[row]
    paragraphs = {t: "".join(s) for t, s in example["context"]}
    steps, steps_used, submitted, done = [], 0, None, False
    for action, valid_parse in outputs:
        assert not done
        force_finish = steps_used >= MAX_STEPS
        if not valid_parse:
            observation = (
                f"Invalid action: {action}. "
                "Action parsing error: output did not match the required format. "
                "No retrieval was executed."
            )
            done = force_finish
        elif force_finish and not action.startswith("Finish"):
            observation = (
                f"Forced finish violation: {action}. Search budget exhausted. No answer submitted."
            )
            done = True
        elif action.startswith("Search["):
            observation = paragraphs.get(action[7:-1], "A paragraph of no question at all.")
        else:
            submitted = action[7:-1]
            observation, done = f"Submitted answer: {submitted}", True
        t = len(steps)
        steps.append(
            {
                "step": t,
                "action": action,
                "env_action": action,
                "action_display": action,
                "observation": observation,
                "history_before": [],
                "current_observation": "",
                "admissible_commands_before": [],
                "searches_remaining_before": max(MAX_STEPS - steps_used, 0),
                "forced_finish": force_finish,
                "valid_parse": valid_parse,
                "model_output": f"Thought: ...\nAction: {action}",
                "prompt_messages": [],
                "env_done": done,
                "env_won": False,
                "env_score": None,
                "env_max_score": None,
                "criteria": [f"c{j} of step {t} ({row}, {sample})" for j in range(K)],
                "scores": [0.5, -0.25 * t, 0.1],
            }
        )
        if not force_finish:
            steps_used += (1 if action.startswith("Search") else 0) if valid_parse else 1
        if force_finish:
            break
    return {
        "example_id": example["_id"],
        "sample_idx": sample,
        "question": example["question"],
        "gold_answer": example["answer"],
        "q_type": example.get("type", ""),
        "level": example.get("level", ""),
        "reward": reward,
        "reward_info": {"em": int(reward), "reward": reward, "detail": "normal"},
        "submitted_answer": submitted,
        "steps": steps,
    }


ANDRE, KEN, BLACK_BOOK = 4, 2, 1  # rows of the sample
RECORDS = [
    # line 1: search the supporting paragraph, answer right
    release_record(ANDRE, 0, [("Search[John André]", True), ("Finish[John André]", True)], 1.0),
    # line 2: a search whose paragraph's sentences join without the space this project's text
    # has, an invalid turn, a search, then a search on the forced turn (no answer)
    release_record(
        ANDRE,
        1,
        [
            ("Search[List of Continental Army units]", True),
            ("I do not know", False),
            ("Search[Benedict Arnold]", True),
            ("Search[John André]", True),
        ],
        0.0,
    ),
    # line 3: a wrong answer at once
    release_record(KEN, 0, [("Finish[Atlantis]", True)], 0.0),
    # line 4: a question assets.train does not hold
    {**release_record(KEN, 1, [("Finish[Atlantis]", True)], 0.0), "example_id": "5a_not_ours"},
    # line 5: a search whose observation is none of the question's paragraphs
    release_record(BLACK_BOOK, 0, [("Search[Nowhere]", True), ("Finish[Dutch]", True)], 1.0),
]


def write_release(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def doc(row: int, title: str) -> str:
    """The distractor retriever's doc id of ``title`` in the row's paragraphs."""
    titles = [p["title"] for p in ROWS[row].metadata["paragraphs"]]
    return str(titles.index(title))


def test_release_records_become_episodes_and_annotations(tmp_path, capsys):
    path = write_release(tmp_path / "warmup_train_k3.jsonl", RECORDS)
    got = import_release(path, ROWS, K, MAX_STEPS)
    paragraph = {p["title"]: p["text"] for p in ROWS[ANDRE].metadata["paragraphs"]}
    right, wander, wrong = got.episodes
    assert [e.question_id for e in got.episodes] == [ROWS[ANDRE].id] * 2 + [ROWS[KEN].id]
    assert [e.metadata["sample"] for e in got.episodes] == [0, 1, 0]
    assert [e.metadata["release_line"] for e in got.episodes] == [1, 2, 3]
    assert [(e.answer, e.reward) for e in got.episodes] == [
        ("John André", 1.0),
        (None, 0.0),
        ("Atlantis", 0.0),
    ]
    # (kind, action, observation, searches left, forced, doc ids)
    assert [tuple(vars(s).values()) for s in right.steps] == [
        ("search", "Search[John André]", paragraph["John André"], 3, False,
         (doc(ANDRE, "John André"),)),
        ("answer", "Finish[John André]", "", 2, False, ()),
    ]  # fmt: skip
    units = "List of Continental Army units"
    assert paragraph[units] != "".join(dict(RAW[ANDRE]["context"])[units])  # whitespace differs
    assert [tuple(vars(s).values()) for s in wander.steps] == [
        ("search", f"Search[{units}]", paragraph[units], 3, False, (doc(ANDRE, units),)),
        ("invalid", "I do not know", INVALID_OBSERVATION, 2, False, ()),
        ("search", "Search[Benedict Arnold]", paragraph["Benedict Arnold"], 1, False,
         (doc(ANDRE, "Benedict Arnold"),)),
        ("search", "Search[John André]", "", 0, True, ()),  # the forced turn: no documents
    ]  # fmt: skip
    assert [(s.kind, s.searches_left) for s in wrong.steps] == [("answer", 3)]
    # the release's criteria and scores, step for step, unprojected
    for ann, (row, sample) in zip(got.annotations, [(ANDRE, 0), (ANDRE, 1), (KEN, 0)], strict=True):
        assert [a.criteria for a in ann] == [
            [f"c{j} of step {t} ({row}, {sample})" for j in range(K)] for t in range(len(ann))
        ]
        assert [a.scores for a in ann] == [[0.5, -0.25 * t, 0.1] for t in range(len(ann))]
    assert len(got.annotations[1]) == 4
    counts = got.counts
    assert {k: counts[k] for k in ("records", "imported", "unknown_question")} == {
        "records": 5,
        "imported": 3,
        "unknown_question": 1,
    }
    assert counts["unmatched_paragraph"] == 1
    assert counts["duplicate"] == counts["over_questions"] == counts["over_samples"] == 0
    assert (counts["correct"], counts["invalid_steps"], counts["forced_searches"]) == (1, 1, 1)
    assert counts["reward_differs"] == 0
    # the release questions are never held out to choose π's epoch, unmatched ones included
    assert got.question_ids == {ROWS[i].id for i in (ANDRE, KEN, BLACK_BOOK)}
    out = capsys.readouterr().out
    assert "imported 3 of 5 records of 2 questions, no request" in out
    assert f"unknown_question 1 (first: {path}:4: example_id '5a_not_ours'" in out
    assert f"unmatched_paragraph 1 (first: {path}:5: steps[0]'s observation" in out


def test_caps_duplicates_and_errors_name_file_and_line(tmp_path):
    path = write_release(tmp_path / "r.jsonl", RECORDS[:3] + [RECORDS[0]])
    got = import_release(path, ROWS, K, MAX_STEPS, questions=1, samples=1)
    assert [(e.question_id, e.metadata["sample"]) for e in got.episodes] == [(ROWS[ANDRE].id, 0)]
    assert (got.counts["over_samples"], got.counts["over_questions"]) == (1, 1)
    assert got.counts["duplicate"] == 1  # line 4 repeats line 1's (example_id, sample_idx)

    short = json.loads(json.dumps(RECORDS[0]))
    short["steps"][1]["criteria"] = short["steps"][1]["criteria"][:2]
    bad = write_release(tmp_path / "k2.jsonl", [RECORDS[2], short])
    # another K (the release's parser kept 2-4 criteria): the play is kept for π, the
    # annotation dropped for μ and counted, as an annotation that does not parse is
    got = import_release(bad, ROWS, K, MAX_STEPS)
    assert len(got.episodes) == 2 and got.counts["k_mismatch"] == 1
    assert got.annotations[0] is not None and got.annotations[1] is None
    assert got.first_skip["k_mismatch"].startswith(f"{bad}:2: an annotated step without 3")
    assert all(a is None for a in import_release(path, ROWS, 4, MAX_STEPS).annotations)
    with pytest.raises(ValueError, match=rf"{path}:1: steps\[0\]: searches remaining 3.*"
                       "env.max_searches=4 gives 4"):  # fmt: skip
        import_release(path, ROWS, K, 4)
    torn = tmp_path / "torn.jsonl"
    torn.write_text(json.dumps(RECORDS[0]) + "\n{not json\n" + json.dumps(RECORDS[2]) + "\n")
    with pytest.raises(ValueError, match=rf"{torn}:2: not a JSON line"):
        import_release(torn, ROWS, K, MAX_STEPS)


@pytest.mark.slow
def test_warmup_from_the_release_file_sends_no_request(tiny_world, tmp_path, monkeypatch, capsys):
    def no_network(self, *args, **kwargs):
        raise AssertionError("a connection was opened")

    def no_client(*args, **kwargs):
        raise AssertionError("an LLM client was built")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(warmup, "LLMClient", no_client)
    release = write_release(tmp_path / "release.jsonl", RECORDS)
    out = tmp_path / "warmup"
    cfg = load_config(
        ArcoConfig,
        CONFIG,
        [
            f"assets.model={tiny_world / 'model'}",
            f"assets.train={SAMPLE}",
            f"warmup_dir={out}",
            "env.setting=distractor",
            f"env.max_searches={MAX_STEPS}",
            "agent.instruction=''",
            "engine.backend=hf",
            "lora.r=4",
            "lora.lora_alpha=8",
            f"rubric.k={K}",
            "warmup.teacher=file",
            f"warmup.release_file={release}",
            "warmup.questions=6",
            "warmup.select_questions=2",
            "warmup.samples=2",
            "warmup.pi_epochs=0",  # π stays the backbone (the tiny setting's); one held-out eval
            "warmup.mu_epochs=1",
            "warmup.check_items=0",
            "warmup.pi_batch=4",
            "warmup.mu_batch=8",
        ],
    )
    assert warmup.run_warmup(cfg) == out
    printed = capsys.readouterr().out
    assert "imported 3 of 5 records" in printed
    assert "3 trajectories" in printed and "π SFT on 1, μ SFT on 2" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["imported"] == 3 and report["counts"]["unknown_question"] == 1
    assert report["pi_sft"]["skipped"] == "warmup.pi_epochs = 0"
    rows = [json.loads(line) for line in (out / "data.jsonl").open()]
    assert [(r["question_id"], r["metadata"]["sample"]) for r in rows] == [
        (ROWS[ANDRE].id, 0),
        (ROWS[ANDRE].id, 1),
        (ROWS[KEN].id, 0),
    ]
    for r in rows:  # projected onto Σ_t mean_k = R
        total = sum(sum(a["scores"]) / K for a in r["annotation"])
        assert total == pytest.approx(r["reward"], abs=1e-6)
    # each search shows its paragraph as the agent shows it: the start of the text
    searches = [s for r in rows for s in r["steps"] if s["kind"] == "search" and s["doc_ids"]]
    assert len(searches) == 3
    for r in rows:
        paragraphs = r["metadata"]["paragraphs"]
        for s in r["steps"]:
            for d in s["doc_ids"]:
                assert paragraphs[int(d)]["text"].startswith(s["observation"])
    assert (out / "adapters" / "rubric" / "adapter_model.safetensors").is_file()
    # the token view π's SFT would train on: the release's actions as the sampled tokens
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "model")
    collected = load_plain(out / "phases" / "collect", warmup.PHASE_CLASSES)
    for t, r in zip(collected["trajs"], rows, strict=True):
        assert [s.kind for s in t.steps] == [s["kind"] for s in r["steps"]]
        for span, step in zip(t.steps, r["steps"], strict=True):
            ids = tokenizer.encode(step["action"], add_special_tokens=False)
            assert t.response_ids[span.start : span.end] == ids
        sampled = {i for s in t.steps for i in range(s.start, s.end)}
        assert {i for i, m in enumerate(t.loss_mask) if m} == sampled
