"""CER on short free-form answers (reading comprehension, ``SCALE=smol``): HotpotQA rows as
problems, the answer-only prompt, the whole response as solution and answer, SQuAD exact match as
the rule, F1 and containment in the evaluation."""

from __future__ import annotations

import json

import pytest
import torch

from cer.data import DataError, load_math_examples
from cer.evaluate import row_metrics
from cer.prompt import SHORT_INSTRUCTION, user_message
from cer.rewards.answer import (
    SHORT_BRIDGE,
    continuation_ids,
    encode_text,
    response_split,
    short_answer_split,
    solution_split,
)
from cer.rewards.expectation import cer_from_logprobs
from cer.rewards.groups import is_correct, verifier_name
from cer.rewards.scoring import hf_prefix_scorer, score_group
from common.smol.data import SOURCE

ROW = {
    "_id": "q1",
    "question": "Which city hosts the river port?",
    "answer": "Dutch Harbor",
    "type": "bridge",
    "supporting_facts": [["B", 0], ["A", 1]],
    "context": [
        ["A", ["A is a town. ", "Its port is Dutch Harbor."]],
        ["Z", ["A distractor."]],
        ["B", ["B sits on a river."]],
    ],
}


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_hotpotqa_row_is_its_supporting_paragraphs_then_the_question(tmp_path):
    (ex,) = load_math_examples(write_rows(tmp_path / "qa.jsonl", [ROW])).examples
    assert ex.id == "qa:q1" and ex.answer == "Dutch Harbor"
    # the supporting paragraphs in context order (A before B), the distractor left out
    assert ex.problem == (
        "A: A is a town. Its port is Dutch Harbor.\n\nB: B sits on a river.\n\n"
        "Question: Which city hosts the river port?"
    )
    assert ex.metadata == {"type": "bridge", "verifier": "qa", "short_answer": True}
    assert user_message(ex) == ex.problem + "\n" + SHORT_INSTRUCTION


def test_the_projects_hotpotqa_sample_loads_whole():
    loaded = load_math_examples(SOURCE)
    assert len(loaded.examples) == 250 and not loaded.skipped
    assert all(ex.problem.count("\n\n") >= 2 for ex in loaded.examples)  # 2+ paragraphs each


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"context": "A"}, "line 2: field 'context' must be a list"),
        ({"supporting_facts": [[]]}, "line 2: field 'supporting_facts' must be"),
        ({"supporting_facts": [["Q", 0]]}, "line 2: no paragraph of 'context' is named"),
        ({"answer": ""}, "line 2: field 'answer' is empty"),
    ],
)
def test_a_bad_hotpotqa_row_names_file_line_and_field(tmp_path, change, message):
    path = write_rows(tmp_path / "qa.jsonl", [ROW, {**ROW, "_id": "q2", **change}])
    with pytest.raises(DataError, match=f"qa.jsonl, {message}"):
        load_math_examples(path, format="hotpotqa")


def test_the_rule_is_squad_exact_match():
    (ex,) = load_math_examples([ROW]).examples
    assert verifier_name(ex) == "qa-em"
    assert is_correct("the dutch harbor.", ex)  # case, article and punctuation normalised
    assert not is_correct("Dutch Harbor, Alaska", ex)  # holds the gold: exact match misses it
    assert not is_correct(None, ex)


def test_a_short_answer_is_its_own_solution_and_the_end_of_turn_closes_it(char_tokenizer):
    tok = char_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    response = encode_text(tok, "12.") + [eos]
    split = short_answer_split(response, tok)
    assert split.answer == "12"  # stripped, the final period dropped
    assert split.solution_ids == encode_text(tok, "12.") + encode_text(tok, SHORT_BRIDGE)
    assert continuation_ids(split, "7", tok) == encode_text(tok, " 7") + [eos]
    assert response_split(response, tok, short_answer=True) == split
    assert response_split(response, tok, short_answer=False) == solution_split(response, tok)
    assert short_answer_split([eos], tok).answer is None
    assert short_answer_split(encode_text(tok, " .") + [eos], tok).answer is None


def test_cer_scores_the_reference_after_each_answer_and_the_bridge(tiny_qwen3, char_tokenizer):
    tok = char_tokenizer
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = encode_text(tok, "Half of 2 is")
    splits = [short_answer_split(encode_text(tok, r) + [eos], tok) for r in ("1", "12", "1/2")]
    ref_logp, answer_logp, answer_of_sample, answers = score_group(
        hf_prefix_scorer(tiny_qwen3), prompt, splits, "1", tok
    )
    assert answers == ["1", "12", "1/2"] and answer_of_sample.tolist() == [0, 1, 2]
    for j, split in enumerate(splits):  # by hand: one plain forward of each whole pair
        cont = encode_text(tok, " 1") + [eos]
        ids = torch.tensor([prompt + split.solution_ids + cont])
        with torch.no_grad():
            logp = torch.log_softmax(tiny_qwen3(ids).logits[0].double(), -1)
        start = len(prompt) + len(split.solution_ids)
        want = sum(logp[start + i - 1, t].item() for i, t in enumerate(cont))
        assert ref_logp[j].item() == pytest.approx(want, abs=1e-4)
    rewards = cer_from_logprobs(ref_logp, answer_logp, answer_of_sample)
    # the spec's property: the reference's own answer earns at least mean_j pi(a* | s_j)
    assert rewards[0] >= ref_logp.exp().mean() - 1e-9
    assert ((rewards >= 0) & (rewards <= 1)).all()


def test_the_evaluation_adds_f1_and_containment_for_short_answer_rows():
    rows = [
        {"answers": ["Dutch Harbor", "Dutch Harbor, Alaska"], "correct": [True, False],
         "exact": [True, False], "f1": [1.0, 0.8], "contains": [1.0, 1.0]},
        {"answers": [None, "Paris"], "correct": [False, False], "exact": [False, False],
         "f1": [0.0, 0.0], "contains": [0.0, 0.0]},
    ]  # fmt: skip
    metrics = row_metrics(rows, 2)
    assert metrics["accuracy"] == 0.25 and metrics["containment"] == 0.5
    assert metrics["f1"] == pytest.approx(1.8 / 4) and metrics["pass@2"] == 0.5
    assert "f1" not in row_metrics([{k: v for k, v in rows[0].items() if k != "f1"}], 2)


def test_dev_results_carry_containment_and_f1_for_the_comparison():
    from cer.evaluate import problem_results

    rows = [{"id": "q1", "answers": ["Dutch Harbor, Alaska"], "correct": [False],
             "exact": [False], "f1": [0.8], "contains": [1.0]}]  # fmt: skip
    (result,) = problem_results(rows)
    assert (result["correct"], result["contains"], result["f1"]) == (False, 1.0, 0.8)
    del rows[0]["f1"], rows[0]["contains"]
    assert "contains" not in problem_results(rows)[0]


def test_the_smol_comparison_spec_pairs_cer_with_the_rule_by_containment():
    from experiments.compare import load_spec

    spec = load_spec("cer/configs/compare_smol.yaml")
    assert (spec["metric"], spec["baseline"], spec["seeds"]) == ("contains", "rule", [0, 1, 2])
    assert [a["name"] for a in spec["arms"]] == ["rule", "cer", "rule+cer"]
    for arm in spec["arms"]:
        assert arm["command"][-2:] == ["--config", "cer/configs/smol.yaml"]
        assert arm["overrides"] == [f"reward.type={arm['name']}"]
