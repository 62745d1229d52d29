"""The shipped configs carry the paper's values; a missing asset is a clear error, early."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import load_config
from eviback.cli import main
from eviback.config import EviBackConfig

CONFIGS = Path(__file__).resolve().parents[2] / "eviback" / "configs"


@pytest.mark.parametrize("scale", ["0.6b", "1.7b", "4b"])
def test_paper_configs(scale):
    c = load_config(EviBackConfig, CONFIGS / f"qwen3_{scale}.yaml")
    assert c.assets.model == f"Qwen/Qwen3-{scale.upper()}"
    assert (c.n, c.questions_per_step, c.steps, c.train.lr, c.agent.topk) == (8, 64, 79, 1e-6, 5)
    assert c.assets.train_quotas == {"nq": 2040, "hotpotqa": 1416, "musique": 897, "2wiki": 747}
    assert sum(c.assets.eval_quotas.values()) == 3500 and len(c.assets.eval) == 7
    assert (c.teacher.beta, c.teacher.gamma, c.teacher.lam, c.teacher.top_m) == (0.1, 0.1, 0.1, 5)
    # the release's loop: no KL loss, token-mean, 12,000 + 4,096 tokens, 1,024 a turn, 10 turns
    # at evaluation, weight decay 0.01, teacher timeout 180 s, seed 42, its question selection
    assert (c.loss.kl_coef, c.loss.aggregation, c.train.weight_decay) == (0.0, "token_mean", 0.01)
    assert (c.agent.max_context, c.agent.max_response_tokens, c.engine.max_model_len) == (
        16096, 4096, 16096,
    )  # fmt: skip
    assert (c.agent.max_turn_tokens, c.eval.max_turns, c.teacher.timeout, c.seed) == (
        1024, 10, 180.0, 42,
    )  # fmt: skip
    assert (c.assets.selection, c.assets.train_selection_seed, c.assets.eval_selection_seed) == (
        "sha256", 26041755, 42,
    )  # fmt: skip
    assert c.assets.release_names == {"2wiki": "2wikimultihopqa"} and c.em_well_formed
    # five Wikipedia-2018 passages (at most 853 Qwen tokens with the frame, README) fit
    assert c.agent.max_obs_tokens >= 853 and c.agent.invalid_eos == "continue"
    assert c.agent.max_turn_tokens + c.agent.max_obs_tokens <= c.agent.max_response_tokens


def test_search_r1_values_are_a_documented_alternative():
    c = load_config(EviBackConfig, CONFIGS / "search_r1_values.yaml")
    assert (c.loss.kl_coef, c.loss.aggregation, c.train.weight_decay) == (
        0.001, "seq_mean_token_mean", 0.0,
    )  # fmt: skip
    assert (c.agent.max_turns, c.eval.max_turns, c.agent.max_turn_tokens) == (4, 4, 500)
    assert (c.agent.max_obs_tokens, c.agent.max_context, c.engine.max_model_len) == (
        500,
        4096,
        4096,
    )
    assert (c.seed, c.teacher.timeout) == (0, 60.0)
    paper = load_config(EviBackConfig, CONFIGS / "qwen3_1.7b.yaml")
    assert c.assets == paper.assets and c.teacher.lam == paper.teacher.lam  # same data and reward


def test_tiny_config_is_offline():
    c = load_config(EviBackConfig, CONFIGS / "tiny.yaml")
    assert c.teacher.backend == "oracle" and not c.assets.retrieval_url
    assert c.assets.model == "runs/warmup/tiny/model"


def test_missing_assets_are_named_with_how_to_get_them(tiny_world, tmp_path, capsys):
    w = tiny_world
    base = [f"assets.model={w / 'model'}", f"assets.train={{t: {w / 'train.jsonl'}}}",
            f"assets.dev={{t: {w / 'dev.jsonl'}}}", f"assets.corpus={w / 'corpus.jsonl'}",
            f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    cases = {
        "assets.model=runs/nowhere/model": "python -m eviback warmup",
        f"assets.train={{nq: {tmp_path / 'nq.jsonl'}}}": "assets.train.nq",
        f"assets.corpus={tmp_path / 'none'}": "make data-index",
        "teacher.backend=llm": "assets.teacher_endpoint",
        f"teacher.policy_file={tmp_path / 'p.yaml'}": "python -m eviback ape",
    }
    for override, needle in cases.items():
        assert main(["train", "--config", str(CONFIGS / "tiny.yaml"), *base, override]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # failed before writing anything
    bad_quota = f"assets.train_quotas={{t: {10**6}}}"
    cfg = load_config(EviBackConfig, CONFIGS / "tiny.yaml", [*base, bad_quota])
    from eviback.assets import load_questions

    with pytest.raises(ValueError, match="quota t=1000000 exceeds"):
        load_questions(cfg.assets.train, cfg.assets.train_quotas, 0)


def test_teacher_prompts_pick_the_hand_written_policy():
    """teacher.prompts: the gated two-stage (default) or its stage-A prompt alone (the paper's
    single-prompt teacher); a policy file wins and may not be set beside `single`; the oracle
    reads no prompt, so `single` with it is refused rather than silently the gated run."""
    from eviback.assets import build_teacher, teacher_policy
    from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT
    from eviback.teacher import TwoStageTeacher

    paper = CONFIGS / "qwen3_0.6b.yaml"
    gated = load_config(EviBackConfig, paper).teacher
    assert teacher_policy(gated).strategy_id.startswith(
        f"gated:{STAGE_A_DEFAULT.id}+{STAGE_B_DEFAULT.id}:"
    )
    single = load_config(EviBackConfig, paper, ["teacher.prompts=single"])
    assert teacher_policy(single.teacher).strategy_id == f"single:{STAGE_A_DEFAULT.id}"
    teacher = build_teacher(single.assets, single.teacher, None)
    assert isinstance(teacher, TwoStageTeacher) and teacher.policy.stage_b is None
    with pytest.raises(ValueError, match="policy_file .*set one of them"):
        load_config(EviBackConfig, paper, ["teacher.prompts=single", "teacher.policy_file=p.yaml"])
    with pytest.raises(ValueError, match="needs teacher.backend=llm: the evidence oracle"):
        load_config(EviBackConfig, CONFIGS / "tiny.yaml", ["teacher.prompts=single"])
    # the teacher off (Search-R1), no prompt is read either way
    off = ["teacher.prompts=single", "teacher.enabled=false"]
    assert load_config(EviBackConfig, CONFIGS / "tiny.yaml", off).teacher.prompts == "single"
    with pytest.raises(ValueError, match="teacher.prompts"):
        load_config(EviBackConfig, paper, ["teacher.prompts=both"])
