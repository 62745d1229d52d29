"""common.reward_adapters: TRL's own reward functions (``trl.rewards``, the installed package) and a
verl-style ``compute_score`` as outcome rewards, on hand-built groups whose responses are encoded
with the project's tiny tokenizer (decoded back exactly); the config path; the errors."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from trl.rewards import (
    accuracy_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)

from common.config import ConfigError, load_config
from common.grpo_config import GRPOConfig
from common.reward_adapters import TRLReward, VerlReward, from_trl, from_verl
from common.rewards import REWARDS, Group, RewardContext, load_part
from common.rollout.trajectory import Trajectory
from common.tinyworld.tokenizer import build_tokenizer

THINK_OK = "<think>\nI add 1 and 2.\n</think>\nThe answer is 3."
THINK_OPEN = "<think>\nI add 1 and 2.\nThe answer is 3."
PLAIN = "The answer is 3."


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(["I add 1 and 2. The answer is 3. \\boxed{\\frac{1}{3}} #### 42"], 320)


def group(
    tok: Any,
    question: str,
    golds: list[str],
    responses: list[str],
    qid: str = "q0",
    aliases: tuple[str, ...] = (),
    predictions: list[str | None] | None = None,
) -> Group:
    """A group whose responses are the tokenizer's ids of ``responses`` plus the EOS token."""
    trajs = [
        Trajectory(
            f"g-{qid}",
            k,
            qid,
            question,
            golds,
            tok.encode(f"Q: {question}"),
            response_ids=tok.encode(r) + [tok.eos_token_id],
        )
        for k, r in enumerate(responses)
    ]
    preds = predictions if predictions is not None else [None] * len(responses)
    return Group(question, golds, list(aliases), trajs, preds)


def test_the_tiny_tokenizer_gives_the_responses_back(tok):
    for text in (THINK_OK, THINK_OPEN, r"So \boxed{\frac{1}{3}}.", "Total: #### 1,234"):
        assert tok.decode(tok.encode(text) + [tok.eos_token_id], skip_special_tokens=True) == text


def test_think_format_reward_as_a_part(tok):
    """TRL's regex ``^<think>(?!.*<think>)(.*?)</think>.*$``: only a closed think block first."""
    reward = from_trl(think_format_reward, format="conversational")
    groups = [
        group(tok, "1 + 2?", ["3"], [THINK_OK, THINK_OPEN, PLAIN]),
        group(tok, "2 + 1?", ["3"], [PLAIN, THINK_OK], qid="q1"),
    ]
    out = reward(groups, RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert out.values.dtype == torch.float32
    assert out.metrics == {
        "trl/think_format_reward/none_share": 0.0,
        "trl/think_format_reward/mostly_none_batches": 0.0,
    }


def test_accuracy_reward_none_becomes_zero_and_is_counted(tok):
    """math-verify: 1/3 right, 1/2 wrong; a gold with no math in it parses to nothing, and TRL's
    accuracy_reward then answers None (not applicable) for both of its completions."""
    groups = [
        group(
            tok,
            "a third?",
            [r"\frac{1}{3}"],
            [r"It is \boxed{\frac{1}{3}}", r"\boxed{\frac{1}{2}}"],
        ),
        group(tok, "no math", ["nothing to parse"], [r"\boxed{3}", "no"], qid="q1"),
    ]
    out = from_trl(accuracy_reward, format="conversational")(groups, RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert out.metrics["trl/accuracy_reward/none_share"] == 2 / 4
    low = from_trl(accuracy_reward, format="conversational", none_value=-1.0, name="acc")
    out = low(groups, RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 0.0, -1.0, -1.0]
    assert out.metrics == {"trl/acc/none_share": 0.5, "trl/acc/mostly_none_batches": 0.0}


def test_reasoning_accuracy_reward_takes_constant_keyword_arguments(tok):
    """``reward_kwargs`` reach every call: the answer after the delimiter is checked, a response
    without it gets 0 (TRL: incomplete reasoning)."""
    reward = TRLReward(
        reasoning_accuracy_reward,
        format="conversational",
        reward_kwargs={"reasoning_delimiters": ["</think>"]},
    )
    responses = [
        r"<think> \boxed{\frac{1}{2}} </think> so \boxed{\frac{1}{3}}",
        r"<think> \boxed{\frac{1}{3}} but no end",
        r"<think> hm </think> \boxed{\frac{1}{2}}",
    ]
    out = reward(
        [group(tok, "a third?", [r"\frac{1}{3}"], responses)], RewardContext(tokenizer=tok)
    )
    assert out.values.tolist() == [1.0, 0.0, 0.0]


def test_a_factory_with_function_args_reads_the_completion_ids(tok):
    """TRL's soft overlong punishment (DAPO): 0 up to L - cache = 6 ids, (6 - |y|) / 4 to L = 10,
    -1 beyond; |y| counts every response id, the EOS included."""
    a = tok.convert_tokens_to_ids("a")
    g = group(tok, "long?", ["x"], ["", "", ""])
    for t, n in zip(g.trajectories, (6, 8, 12), strict=True):
        t.response_ids = [a] * n
    reward = TRLReward(
        "trl.rewards:get_soft_overlong_punishment",
        function_args={"max_completion_len": 10, "soft_punish_cache": 4},
    )
    assert reward([g], RewardContext(tokenizer=tok)).values.tolist() == [0.0, -0.5, -1.0]
    assert reward.name == "soft_overlong_punishment_reward"
    assert reward.label.startswith("trl.rewards:get_soft_overlong_punishment(max_completion_len=10")
    direct = from_trl(get_soft_overlong_punishment(10, 4))
    assert direct([g], RewardContext(tokenizer=tok)).values.tolist() == [0.0, -0.5, -1.0]


def reward_len(completions, **kwargs):
    """TRL's documentation's first custom reward (standard format): completions near 20 chars."""
    return [-abs(20 - len(completion)) for completion in completions]


def test_a_standard_format_reward_from_trls_docs(tok):
    g = group(tok, "say it", ["3"], [PLAIN, "The answer is 3, surely."])  # 16 and 24 chars
    assert from_trl(reward_len)([g], RewardContext(tokenizer=tok)).values.tolist() == [-4.0, -4.0]


def test_what_a_trl_function_is_given(tok):
    """One call per group: prompts, completions, completion_ids, the columns, the trainer state,
    log_metric (averaged over the calls) and log_extra; the call's keyword lists one per sample."""
    calls: list[dict[str, Any]] = []

    def spy(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **kw):
        calls.append(dict(kw, prompts=prompts, completions=completions, ids=completion_ids,
                          step=trainer_state.global_step))  # fmt: skip
        log_metric("length", float(len(completions[0])))
        log_extra("ignored", [1] * len(completions))
        return [1.0] * len(completions)

    groups = [
        group(tok, "1 + 2?", ["3", "three"], [PLAIN, THINK_OK]),
        group(tok, "2 + 2?", ["4"], ["4"], qid="q1"),
    ]
    out = TRLReward(spy, solution_column="ground_truth")(
        groups, RewardContext(tokenizer=tok, step=7)
    )
    assert len(calls) == 2
    first = calls[0]
    assert first["prompts"] == ["1 + 2?", "1 + 2?"]
    assert first["completions"] == [PLAIN, THINK_OK]
    assert first["ids"] == [t.response_ids for t in groups[0].trajectories]
    assert first["ground_truth"] == ["3", "3"] and "solution" not in first
    assert first["question"] == ["1 + 2?"] * 2
    assert first["golden_answers"] == [["3", "three"]] * 2
    assert first["step"] == 7
    assert calls[1]["completions"] == ["4"]
    assert out.metrics["trl/spy/length"] == (len(PLAIN) + 1) / 2

    calls.clear()
    TRLReward(spy, format="conversational")(groups[1:], RewardContext(tokenizer=tok))
    assert calls[0]["prompts"] == [[{"role": "user", "content": "2 + 2?"}]]
    assert calls[0]["completions"] == [[{"role": "assistant", "content": "4"}]]
    assert calls[0]["solution"] == ["4"]

    calls.clear()
    TRLReward(spy, prompt="decoded")(groups[1:], RewardContext(tokenizer=tok))
    assert calls[0]["prompts"] == ["Q: 2 + 2?"]


def test_an_async_trl_function_is_awaited(tok):
    async def judge(completions, **kwargs):
        return [0.5 for _ in completions]

    g = group(tok, "q", ["a"], ["x", "y"])
    assert TRLReward(judge)([g], RewardContext(tokenizer=tok)).values.tolist() == [0.5, 0.5]


def test_a_nan_is_not_applicable_too(tok):
    g = group(tok, "q", ["a"], ["x", "y"])
    out = TRLReward(lambda completions, **kw: [float("nan"), 1])([g], RewardContext(tokenizer=tok))
    assert out.values.tolist() == [0.0, 1.0]
    assert out.metrics == {"trl/<lambda>/none_share": 0.5, "trl/<lambda>/mostly_none_batches": 0}


# a verl custom reward function in verl's documented form, fn(data_source, solution_str,
# ground_truth, extra_info=None); GSM8K's rule: the last "#### <number>" (commas dropped) is the
# answer, equal to the ground truth: 1; formatted but wrong: format_score; no "####": 0
def gsm8k_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "") == ground_truth else format_score


def gsm8k_score_dict(data_source, solution_str, ground_truth, extra_info=None):
    found = re.findall(r"#### (-?[0-9.,]+)", solution_str)
    answer = found[-1].replace(",", "") if found else None
    return {
        "score": float(answer == ground_truth),
        "formatted": bool(found),
        "length": len(solution_str),
        "pred": answer,  # not a number: not a metric
    }


GSM8K = ["So 6 * 7 = 42.\n#### 42", "#### 41", "It is 42.", "#### 1,042\n#### 42"]


def test_verl_compute_score_gsm8k(tok):
    g = group(tok, "6 * 7?", ["42"], GSM8K)
    h = group(tok, "1000 + 234?", ["1234"], ["#### 1,234"], qid="q1")
    ctx = RewardContext(tokenizer=tok)
    out = from_verl(gsm8k_score, data_source="openai/gsm8k")([g, h], ctx)
    assert out.values.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert out.metrics == {}
    scored = VerlReward(gsm8k_score, reward_kwargs={"format_score": 0.1})([g], ctx)
    assert scored.values.tolist() == pytest.approx([1.0, 0.1, 0.0, 1.0])


def test_verl_dict_score_and_its_metrics(tok):
    g = group(tok, "6 * 7?", ["42"], GSM8K)
    out = from_verl(gsm8k_score_dict, data_source="openai/gsm8k")([g], RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 0.0, 0.0, 1.0]
    lengths = [len(r) for r in GSM8K]
    assert out.metrics == pytest.approx(
        {
            "verl/gsm8k_score_dict/formatted": 3 / 4,
            "verl/gsm8k_score_dict/length": sum(lengths) / 4,
        }
    )


def test_what_a_verl_function_is_given(tok):
    seen: list[dict[str, Any]] = []

    def spy(data_source, solution_str, ground_truth, extra_info=None, **kw):
        seen.append(dict(kw, data_source=data_source, text=solution_str, truth=ground_truth,
                         info=extra_info))  # fmt: skip
        return 1

    g = group(tok, "6 * 7?", ["42", "forty-two"], ["#### 42", "hm"], aliases=("42.0",),
              predictions=["42", None])  # fmt: skip
    VerlReward(spy, data_source="gsm8k", reward_kwargs={"method": "strict"})(
        [g], RewardContext(tokenizer=tok, step=3)
    )
    assert [s["text"] for s in seen] == ["#### 42", "hm"]
    assert seen[0]["data_source"] == "gsm8k" and seen[0]["method"] == "strict"
    assert seen[0]["truth"] == "42"
    assert seen[1]["info"] == {
        "question": "6 * 7?",
        "golden_answers": ["42", "forty-two"],
        "prediction": None,
        "index": 1,
        "step": 3,
    }
    seen.clear()
    VerlReward(spy, ground_truth="all")([g], RewardContext(tokenizer=tok))
    assert seen[0]["truth"] == ["42", "forty-two", "42.0"]


def test_the_config_path(tok):
    """``reward.fn`` names the adapter class, ``reward.fn_args`` its arguments; resolved when the
    config is built, so a bad function fails there, naming the key."""
    args = {"function": "trl.rewards:think_format_reward", "format": "conversational"}
    part = load_part("common.reward_adapters:TRLReward", "reward.fn", "reward", REWARDS, args)
    g = group(tok, "q", ["3"], [THINK_OK, PLAIN])
    assert part([g], RewardContext(tokenizer=tok)).values.tolist() == [1.0, 0.0]

    cfg = load_config(
        GRPOConfig,
        None,
        [
            "reward.fn=common.reward_adapters:TRLReward",
            'reward.fn_args={function: "trl.rewards:think_format_reward", format: conversational}',
        ],
    )
    assert isinstance(cfg.reward.reward_fn(), TRLReward)
    assert cfg.reward.reward_fn().fn is think_format_reward

    cfg = load_config(
        GRPOConfig,
        None,
        [
            "reward.fn=common.reward_adapters:VerlReward",
            f"reward.fn_args.function={__name__}:gsm8k_score",
            "reward.fn_args.data_source=openai/gsm8k",
            "reward.fn_args.reward_kwargs.format_score=0.5",
        ],
    )
    verl = cfg.reward.reward_fn()
    out = verl([group(tok, "6 * 7?", ["42"], GSM8K)], RewardContext(tokenizer=tok))
    assert out.values.tolist() == [1.0, 0.5, 0.0, 1.0]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["reward.fn_args.function=trl.rewards:no_such_reward"],
         r"reward\.fn='common\.reward_adapters:TRLReward': function='trl\.rewards:no_such_reward' "
         r"does not import"),
        (["reward.fn_args.function=trl.rewards"], "is not of the form package.module:name"),
        (["reward.fn_args={function: 'trl.rewards:think_format_reward', format: chat}"],
         "format must be 'auto', 'standard' or 'conversational'"),
        (["reward.fn_args={function: 'trl.rewards:think_format_reward', formt: standard}"],
         "does not take the arguments"),
        (["reward.fn_args={}"], "missing a required argument: 'function'"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(GRPOConfig, None, ["reward.fn=common.reward_adapters:TRLReward", *overrides])


def test_fn_args_for_a_built_in_is_refused_when_the_config_is_built():
    with pytest.raises(ConfigError, match="is not a class, so it takes no arguments"):
        load_config(GRPOConfig, None, ["reward.fn=exact_match", "reward.fn_args.x=1"])


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda completions, **kw: [1.0], r"returned 1 rewards for 2 completions"),
        (lambda completions, **kw: [1.0, "1"], r"returned '1' \(str\) as a reward, not a finite"),
        (lambda completions, **kw: [1.0, float("inf")], r"returned inf \(float\) as a reward"),
        (lambda completions, **kw: 1.0, r"returned 1\.0 \(float\), not a list of one reward"),
        (lambda completions, **kw: None, r"returned None \(NoneType\), not a list"),
    ],
)
def test_trl_errors_name_the_function_and_the_group(tok, fn, match):
    groups = [group(tok, "fine", ["a"], ["x", "y"]), group(tok, "6 * 7?", ["42"], ["x", "y"], "q7")]
    good = groups[0]
    calls = iter([[1.0, 1.0], None])

    def first_fine(completions, **kw):
        got = next(calls)
        return got if got is not None else fn(completions, **kw)

    with pytest.raises(ValueError, match=match) as e:
        TRLReward(first_fine)([good, groups[1]], RewardContext(tokenizer=tok))
    assert "first_fine on group 1 (q7: '6 * 7?')" in str(e.value)


def test_verl_errors_name_the_function_group_and_trajectory(tok):
    g = group(tok, "6 * 7?", ["42"], ["x", "y"], "q7")
    ctx = RewardContext(tokenizer=tok)
    where = "on group 0 (q7: '6 * 7?'), trajectory 0"
    for fn, match in [
        (lambda **kw: None, r"returned None \(NoneType\) as a reward, not a finite number"),
        (lambda **kw: {"acc": 1.0}, r"returned a dict without a 'score' key \(keys \['acc'\]\)"),
        (lambda **kw: {"score": "1"}, r"returned '1' \(str\) as a reward"),
        (lambda **kw: float("nan"), r"returned nan \(float\) as a reward"),
    ]:
        with pytest.raises(ValueError, match=match) as e:
            VerlReward(fn)([g], ctx)
        assert where in str(e.value)


def test_an_exception_in_the_function_is_noted(tok):
    """The exception stays what it was, with a note naming the function and the group; with
    strings for completions, the note says TRL's own rewards need the conversational format."""
    g = group(tok, "1 + 2?", ["3"], [THINK_OK])
    with pytest.raises(TypeError) as e:  # format=auto (the default) would take the messages
        TRLReward("trl.rewards:think_format_reward", format="standard")(
            [g], RewardContext(tokenizer=tok)
        )
    note = "\n".join(e.value.__notes__)
    assert "raised by trl.rewards:think_format_reward on group 0 (q0: '1 + 2?')" in note
    assert "needs format='conversational'" in note

    def broken(**kw):
        raise RuntimeError("judge offline")

    with pytest.raises(RuntimeError, match="judge offline") as e:
        VerlReward(broken)([g], RewardContext(tokenizer=tok))
    assert "trajectory 0" in e.value.__notes__[0] and "conversational" not in e.value.__notes__[0]


def test_no_tokenizer_and_bad_arguments():
    g = Group("q", ["a"], [], [Trajectory("g", 0, "q0", "q", ["a"], [1], [2])], [None])
    with pytest.raises(ValueError, match=r"decoding the responses needs ctx\.tokenizer"):
        from_trl(reward_len)([g], RewardContext())
    with pytest.raises(ValueError, match="prompt='decoded' is the templated prompt text"):
        TRLReward(reward_len, format="conversational", prompt="decoded")
    with pytest.raises(ValueError, match="solution_column must be a keyword name"):
        TRLReward(reward_len, solution_column="gold answer")
    with pytest.raises(ValueError, match="ground_truth must be 'auto', 'first', 'all' or 'target'"):
        VerlReward(gsm8k_score, ground_truth="last")
    with pytest.raises(ValueError, match=r"made float, not a callable"):
        TRLReward(lambda: 1.0, function_args={})
    with pytest.raises(ValueError, match=r"unexpected keyword argument 'max_len'"):
        TRLReward(get_soft_overlong_punishment, function_args={"max_len": 3})
    with pytest.raises(
        ValueError, match=r"function trl\.rewards:x is not callable|does not import"
    ):
        TRLReward("trl.rewards:x")


def test_cer_config_takes_an_adapter_with_its_arguments():
    from cer.config import CERConfig
    from common.config import load_config
    from common.reward_adapters import TRLReward

    cfg = load_config(
        CERConfig,
        None,
        [
            "reward.fn=common.reward_adapters:TRLReward",
            "reward.fn_args.function=trl.rewards:think_format_reward",
            "reward.fn_args.format=conversational",
        ],
    )
    part = cfg.reward.reward_fn()
    assert isinstance(part, TRLReward)
    with pytest.raises(ValueError, match="reward.fn"):
        load_config(CERConfig, None, ["reward.fn_args.function=trl.rewards:think_format_reward"])
