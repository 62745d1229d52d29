"""CER's release behaviours as options: per-answer solution choice, VeriFree's 0 without an
answer, the release's rule checks, the paper configs' six benchmarks, and sampling seeds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cer.config import CERConfig
from cer.data import MathExample
from cer.rewards.expectation import cer_from_logprobs, select_solutions, verifree_reward
from cer.rewards.groups import Rules, is_correct, verifier_name
from cer.rewards.verifiers import release_rule_verifier, strict_choice_verifier
from cer.rollout import prompt_seeds, step_sampling
from common.config import load_config
from common.rollout.engine import SamplingConfig, request_seeds

SIX = {"math500", "amc23", "aime24", "aime25", "mmlu_pro", "supergpqa"}
PAPER_CONFIGS = sorted(Path("cer/configs").glob("qwen3_*.yaml"))


def test_select_solutions_per_answer_by_hand():
    # samples' answers: 0 1 1 0 2 1 (U = 3), m = 2
    of = torch.tensor([0, 1, 1, 0, 2, 1])
    mask = select_solutions(of, 3, 2, "per_answer")
    # answer 0: samples 0 and 3 produced it; answer 1: 1, 2 (not 5); answer 2: 4, then sample 0
    assert mask.T.tolist() == [
        [True, False, False, True, False, False],
        [False, True, True, False, False, False],
        [True, False, False, False, True, False],
    ]
    first = select_solutions(of, 3, 2, "first")
    assert first.T.tolist() == [[True, True, False, False, False, False]] * 3
    assert select_solutions(of, 3, None).all() and select_solutions(of, 3, 6).all()
    with pytest.raises(ValueError, match="rule must be"):
        select_solutions(of, 3, 2, "random")


def test_cer_counts_only_the_selected_solutions():
    # pi(a*|s_j) = 0.8, 0.2, 0.5; answer 0: pi(a0|s_j) = 0.5, 0.25, 0.1; answer 1: 0.1, 0.4, 0.4
    ref = torch.tensor([0.8, 0.2, 0.5]).log()
    ans = torch.tensor([[0.5, 0.1], [0.25, 0.4], [0.1, 0.4]]).log()
    counted = torch.tensor([[True, False], [False, True], [True, True]])
    got = cer_from_logprobs(ref, ans, torch.tensor([0, 1, -1]), counted=counted)
    r0 = (0.5 * 0.8 + 0.1 * 0.5) / (0.5 + 0.1)  # solutions 0 and 2
    r1 = (0.4 * 0.2 + 0.4 * 0.5) / (0.4 + 0.4)  # solutions 1 and 2
    assert got.tolist() == pytest.approx([r0, r1, 0.0])
    with pytest.raises(ValueError, match="counted must be"):
        cer_from_logprobs(ref, ans, torch.tensor([0]), counted=counted[:2])


def test_verifree_is_zero_without_an_answer():
    ref = torch.tensor([0.0, math.log(0.25), math.log(0.5)])
    assert verifree_reward(ref, torch.tensor([0, -1, 1])).tolist() == pytest.approx([1.0, 0.0, 0.5])


def test_release_rule_reads_the_last_512_characters_without_a_box():
    assert release_rule_verifier("So x = 1/2, that is $\\frac{1}{2}$.", "0.5")
    assert not release_rule_verifier("So $x = 3$.", "4")
    # the answer more than 512 characters before the end is out of its reach
    late = "The answer is $7$." + " and so on" * 60
    assert len(late) > 512 and not release_rule_verifier(late, "7")
    assert release_rule_verifier(late[-400:] + " The answer is $7$.", "7")
    assert not release_rule_verifier("", "7")


def test_strict_choice_equality():
    assert strict_choice_verifier("B", "B") and strict_choice_verifier(" B ", "B")
    for said in ("(B)", "B.", "\\text{B}", "b", "B) 4"):
        assert not strict_choice_verifier(said, "B"), said


def test_rules_choose_the_verifier():
    math_ex = MathExample("m", "q", "7", {})
    mc = MathExample("c", "q", "B", {"multiple_choice": True})
    release = Rules("last512", "strict")
    # the release's math rule needs no box and reads the response; the boxed rule needs a box
    assert is_correct(None, math_ex, "so it is 7", release)
    assert not is_correct(None, math_ex, "so it is 7")
    assert is_correct("(B)", mc) and not is_correct("(B)", mc, None, release)
    assert is_correct("B", mc, None, release)
    assert (verifier_name(math_ex, release), verifier_name(mc, release)) == (
        "math-verify-last512",
        "strict-choice",
    )
    with pytest.raises(ValueError, match="needs the response text"):
        is_correct("7", math_ex, None, release)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_paper_configs_evaluate_all_six_benchmarks(path):
    cfg = load_config(CERConfig, path)
    assert set(cfg.assets.eval) == SIX  # whatever the training data
    assert all(f"data/cer/{name}.jsonl" == p for name, p in cfg.assets.eval.items())
    assert all(f"{name}.jsonl" in cfg.assets.how_to_get for name in SIX)
    assert cfg.eval.k == 16 and cfg.eval.k_by_benchmark == {"mmlu_pro": 1, "supergpqa": 1}
    r = cfg.reward
    assert (r.m_selection, r.math_verifier, r.choice_verifier) == (
        "per_answer",
        "last512",
        "strict",
    )


def effective_seeds(params: SamplingConfig) -> list[int]:
    """The seed of every sample, as GPU vLLM derives them: request seed + sample index."""
    return [s + k for s in request_seeds(params, len(params.prompt_seeds)) for k in range(params.n)]


def test_every_sample_of_a_run_has_its_own_seed():
    cfg = load_config(CERConfig, "cer/configs/tiny.yaml", ["group_size=8", "seed=3"])
    seen: list[int] = []
    for step in (1, 2, 3):
        for rank in (0, 1):
            params = step_sampling(cfg, step, rank, 2, 4)
            assert params.n == 8 and params.seed == params.prompt_seeds[0]
            seen += effective_seeds(params)
    assert len(seen) == 3 * 2 * 4 * 8 == len(set(seen))
    # another run seed moves the whole range
    assert not set(prompt_seeds(4, 1, 0, 1, 4, 8)) & set(prompt_seeds(3, 1, 0, 1, 4, 8))


def test_request_seeds():
    assert request_seeds(SamplingConfig(seed=5), 3) == [5, 5, 5]
    assert request_seeds(SamplingConfig(prompt_seeds=[1, 9]), 2) == [1, 9]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        request_seeds(SamplingConfig(prompt_seeds=[1, 9]), 3)
