"""Reward functions as verl's and TRL's users write them, unchanged, as this project's outcome
rewards: given directly as ``reward.fn`` or through ``common.reward_adapters``, checked
when the config is built by a call on one example, "not applicable" counted and warned about.

The functions below are this file's own copies in the public shapes of verl's
``verl.utils.reward_score`` (``gsm8k.compute_score(solution_str, ground_truth, ...)``,
``search_r1_like_qa_em.compute_score`` reading ``ground_truth["target"]``), Search-R1's
``qa_em.compute_score_em`` (which finds the answer after the prompt's example answer, so it reads
prompt + response), verl's custom-reward form ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)`` and TRL's ``reward_func(completions, **kwargs)`` (strings or chat
messages, dataset columns as keyword lists, ``None`` for "not applicable"). Values by hand.
"""

from __future__ import annotations

import re
import string
from typing import Any

import pytest

from common.config import ConfigError, load_config
from common.grpo_config import GRPOConfig
from common.reward_adapters import TRLReward, VerlReward, adapter_for, from_trl, from_verl
from common.rewards import Group, RewardContext
from common.rollout.trajectory import Trajectory
from common.tinyworld.tokenizer import build_tokenizer

HERE = __name__
PROMPT = (
    "Answer the question. Put the final answer between <answer> and </answer>, for example "
    "<answer> Beijing </answer>. Question: Who wrote Hamlet?"
)
HAMLET = [
    "<think>A play by Shakespeare.</think>\n<answer>Shakespeare</answer>",
    "<answer>The William Shakespeare</answer>",
    "<answer>Marlowe</answer>",
    "I do not know.",
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([PROMPT, *HAMLET, "#### 1,042 #### 42 \\boxed{\\frac{1}{3}}"], 330)


def group(tok: Any, question: str, golds: list[str], responses: list[str], qid: str = "q0",
          aliases: tuple[str, ...] = (), prompt: str = "") -> Group:  # fmt: skip
    trajs = [
        Trajectory(
            f"g-{qid}",
            k,
            qid,
            question,
            golds,
            tok.encode(prompt or question),
            response_ids=tok.encode(r) + [tok.eos_token_id],
        )  # fmt: skip
        for k, r in enumerate(responses)
    ]
    return Group(question, golds, list(aliases), trajs, [None] * len(responses))


def hamlet(tok: Any) -> Group:
    return group(tok, "Who wrote Hamlet?", ["William Shakespeare"], HAMLET,
                 aliases=("Shakespeare",), prompt=PROMPT)  # fmt: skip


# --- verl's shapes -------------------------------------------------------------------------


def gsm8k_compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    """verl's gsm8k rule: the last ``#### <number>`` (commas dropped) against the ground truth, a
    string; formatted but wrong: format_score; no ``####``: 0."""
    found = re.findall(r"#### (\-?[0-9\.\,]+)", solution_str)
    if not found:
        return 0
    return score if found[-1].replace(",", "") == ground_truth else format_score


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def em_check(prediction: str, golden_answers) -> int:
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    return int(any(normalize_answer(g) == normalize_answer(prediction) for g in golden_answers))


def search_r1_like_compute_score(
    solution_str, ground_truth, method="strict", format_score=0.0, score=1.0
):
    """verl's ``search_r1_like_qa_em``: the last ``<answer>`` of the response, EM against
    ``ground_truth["target"]`` (a list)."""
    matches = re.findall(r"<answer>(.*?)</answer>", solution_str, re.DOTALL)
    if not matches:
        return 0
    return score if em_check(matches[-1].strip(), ground_truth["target"]) else format_score


def compute_score_em(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    """Search-R1's ``qa_em.compute_score_em``: its solution_str is prompt + response, so the
    prompt's example answer comes first and one match alone is no answer."""
    matches = re.findall(r"<answer>(.*?)</answer>", solution_str, re.DOTALL)
    if len(matches) <= 1:
        return 0
    return score if em_check(matches[-1].strip(), ground_truth["target"]) else format_score


def custom_compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's custom reward form: a dict with ``score`` and other numbers."""
    matches = re.findall(r"<answer>(.*?)</answer>", solution_str)
    right = bool(matches) and em_check(matches[-1], ground_truth)
    return {"score": float(right), "answered": float(bool(matches)), "source": data_source}


def test_verl_s_own_scorers_take_no_data_source_and_are_called_with_what_they_name(tok):
    """verl's gsm8k and search_r1_like_qa_em scorers have no data_source or extra_info parameter:
    ``default_compute_score`` calls them with (solution_str, ground_truth); so does the adapter."""
    g = group(tok, "6 * 7?", ["42"], ["So 6 * 7 = 42.\n#### 42", "#### 41", "#### 1,042\n#### 42"])
    ctx = RewardContext(tokenizer=tok)
    assert from_verl(gsm8k_compute_score, "openai/gsm8k")([g], ctx).values.tolist() == [1, 0, 1]
    # its Search-R1 scorer reads ground_truth["target"]: the gold answers and aliases
    out = from_verl(search_r1_like_compute_score, "searchR1_nq", ground_truth="target")
    assert out([hamlet(tok)], ctx).values.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_the_ground_truth_shape_is_found_by_a_call(tok):
    """ground_truth=auto (the default): the first gold answer, a string, until a call fails with
    it and succeeds with {"target": [gold answers and aliases]}; from then on the latter."""
    reward = VerlReward(search_r1_like_compute_score)
    assert reward.ground_truth == "auto"
    out = reward([hamlet(tok)], RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert reward.ground_truth == "target"
    plain = VerlReward(gsm8k_compute_score)  # a string that works settles nothing: still auto
    plain.check_on_example()
    assert plain.ground_truth == "auto"
    g = group(tok, "6 * 7?", ["42"], ["#### 42"])
    assert plain([g], RewardContext(tokenizer=tok)).values.tolist() == [1.0]


def test_search_r1_s_scorer_reads_prompt_and_response(tok):
    """Search-R1 decodes prompt + response for its scorer (the prompt's example answer is the
    first match): ``solution_str=sequence``. On the response alone every answer scores 0."""
    ctx = RewardContext(tokenizer=tok)
    whole = VerlReward(compute_score_em, solution_str="sequence")
    assert whole([hamlet(tok)], ctx).values.tolist() == [1.0, 1.0, 0.0, 0.0]
    alone = VerlReward(compute_score_em, ground_truth="target")
    assert alone([hamlet(tok)], ctx).values.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_verl_functions_given_directly_as_reward_fn(tok):
    """No adapter named: a function with ``solution_str`` is verl's; ``reward.fn_args`` are the
    adapter's arguments."""
    cfg = load_config(GRPOConfig, None, [f"reward.fn={HERE}:search_r1_like_compute_score"])
    reward = cfg.reward.reward_fn()
    assert isinstance(reward, VerlReward) and reward.ground_truth == "target"
    ctx = RewardContext(tokenizer=tok)
    assert reward([hamlet(tok)], ctx).values.tolist() == [1.0, 1.0, 0.0, 0.0]

    cfg = load_config(
        GRPOConfig,
        None,
        [
            f"reward.fn={HERE}:custom_compute_score",
            "reward.fn_args.data_source=nq",
            "reward.fn_args.ground_truth=first",
        ],
    )
    out = cfg.reward.reward_fn()([hamlet(tok)], ctx)
    # "William Shakespeare" only (ground_truth=first): the alias alone is not it
    assert out.values.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert out.metrics == {"verl/custom_compute_score/answered": 3 / 4}

    cfg = load_config(
        GRPOConfig,
        None,
        [f"reward.fn={HERE}:compute_score_em", "reward.fn_args.solution_str=sequence"],
    )
    assert cfg.reward.reward_fn()([hamlet(tok)], ctx).values.tolist() == [1.0, 1.0, 0.0, 0.0]


# --- TRL's shapes --------------------------------------------------------------------------


def boxed_accuracy(completions, solution, **kwargs):
    """TRL's ``accuracy_reward`` shape: chat messages in, None where the gold is no number."""
    out: list[float | None] = []
    for completion, sol in zip(completions, solution, strict=True):
        text = completion[0]["content"]
        if not re.fullmatch(r"-?[0-9]+", sol):
            out.append(None)
            continue
        found = re.findall(r"\\boxed\{([^}]*)\}", text)
        out.append(float(bool(found) and found[-1] == sol))
    return out


def gsm8k_correctness(prompts, completions, answer, **kwargs):
    """A TRL tutorial's GSM8K reward: strings, the ``answer`` column."""
    return [
        2.0 if c.split("####")[-1].strip() == a else 0.0
        for c, a in zip(completions, answer, strict=True)
    ]


def strict_columns(completions, solution):
    """No **kwargs: TRL would pass it every column and fail; here it gets what it names."""
    return [float(s in c) for c, s in zip(completions, solution, strict=True)]


def test_trl_functions_given_directly_as_reward_fn(tok):
    ctx = RewardContext(tokenizer=tok)
    g = group(tok, "6 * 7?", ["42"], ["#### 42", "#### 41", "so \\boxed{42}"])
    for fn, values in [
        ("gsm8k_correctness", [2.0, 0.0, 0.0]),
        ("strict_columns", [1.0, 0.0, 1.0]),
        ("boxed_accuracy", [0.0, 0.0, 1.0]),
    ]:
        cfg = load_config(GRPOConfig, None, [f"reward.fn={HERE}:{fn}"])
        reward = cfg.reward.reward_fn()
        assert isinstance(reward, TRLReward), fn
        assert reward([g], ctx).values.tolist() == values, fn
    # boxed_accuracy reads completion[0]["content"]: the check's call found the chat format
    assert reward.format == "conversational"
    assert from_trl(gsm8k_correctness).format == "auto"


def test_mostly_not_applicable_is_warned_and_counted(tok, capsys):
    """A batch where more than half the rewards are None: one line on stderr (the function, the
    share, the value they got, the gold it was given) and ``trl/<name>/mostly_none_batches``."""
    reward = from_trl(boxed_accuracy)
    ctx = RewardContext(tokenizer=tok, step=3)
    qa = [group(tok, "Who wrote Hamlet?", ["Shakespeare"], ["\\boxed{42}", "no"]),
          group(tok, "6 * 7?", ["42"], ["\\boxed{42}"], qid="q1")]  # fmt: skip
    out = reward(qa, ctx)
    assert out.values.tolist() == [0.0, 0.0, 1.0]
    assert out.metrics["trl/boxed_accuracy/none_share"] == pytest.approx(2 / 3)
    assert out.metrics["trl/boxed_accuracy/mostly_none_batches"] == 1
    err = capsys.readouterr().err
    assert "boxed_accuracy: 2 of 3 rewards at step 3 were None (not applicable)" in err
    assert "'Shakespeare'" in err
    out = reward(qa, ctx)
    assert out.metrics["trl/boxed_accuracy/mostly_none_batches"] == 2
    half = reward([qa[0], qa[1], qa[1]], ctx)  # 2 of 4: not most
    assert half.metrics["trl/boxed_accuracy/mostly_none_batches"] == 2


# --- the check when the config is built -----------------------------------------------------


def verl_wrong_key(solution_str, ground_truth, **kwargs):
    return float(ground_truth["answer"] in solution_str)


def trl_one_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def trl_needs_a_column(completions, difficulty, **kwargs):
    return [1.0 for _ in completions]


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        ("verl_wrong_key", r"reward\.fn='[\w.]+:verl_wrong_key' \(a verl compute_score\): called on "
         r"one example .* it raised TypeError: string indices must be integers"),
        ("trl_one_short", r"\(a TRL reward function\): called on one example .* returned 1 rewards "
         r"for 2 completions"),
        ("trl_needs_a_column", r"missing 1 required positional argument: 'difficulty'.*"
         r"solution_column"),
    ],
)  # fmt: skip
def test_a_function_that_fails_on_one_example_stops_the_config(fn, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPOConfig, None, [f"reward.fn={HERE}:{fn}"])


def test_adapter_for_wraps_only_trl_and_verl_shapes():
    assert isinstance(adapter_for(gsm8k_compute_score), VerlReward)
    assert isinstance(adapter_for(strict_columns, {"format": "standard"}), TRLReward)
    assert adapter_for(lambda groups, ctx: None) is None
    assert adapter_for(TRLReward) is None  # a class is built from reward.fn_args instead


def test_adapter_arguments_are_checked_for_a_direct_function():
    with pytest.raises(ConfigError, match=r"does not take the arguments \['formt'\]"):
        load_config(
            GRPOConfig, None, [f"reward.fn={HERE}:strict_columns", "reward.fn_args.formt=x"]
        )


def test_every_trainer_takes_a_trl_or_verl_function():
    """CER, EviBack and ARCO build theirs through the same check (ARCO's outcome reward is a part
    now: ``reward.fn``, default exact_match, EM as before)."""
    from arco.config import ArcoConfig
    from cer.config import CERConfig
    from eviback.config import EviBackConfig

    for cls in (CERConfig, EviBackConfig, ArcoConfig):
        cfg = load_config(cls, None, [f"reward.fn={HERE}:gsm8k_correctness"])
        assert isinstance(cfg.reward.reward_fn(), TRLReward), cls.__name__
        with pytest.raises(ConfigError, match="called on one example"):
            load_config(cls, None, [f"reward.fn={HERE}:trl_one_short"])
    assert ArcoConfig().reward.fn == "exact_match"
