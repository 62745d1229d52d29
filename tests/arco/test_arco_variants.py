"""The ablation and baseline variants (arco/configs/variants/) over every shipped config: each
changes exactly its keys, its run folder and warmup follow the base config's, and the paper
configs' values are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from arco.config import ArcoConfig
from arco.rubric_prompt import read_criteria_file
from arco.variants import load_variant, variant_names, variant_overrides
from common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(
    p for p in (ROOT / "arco" / "configs").glob("*.yaml") if not p.name.startswith("compare")
)
PAPER = [p for p in CONFIGS if not p.stem.startswith(("tiny", "smol"))]  # not paper configs

# variant -> (method, rubric mode, prefix, k, frozen μ, KL direction, own warmup suffix)
EXPECTED = {
    "outcome_only": ("outcome_only", "adaptive", "before", 3, True, "forward", None),
    "prm": ("prm", "none", "before", 3, True, "forward", "_none"),
    "wo_rubric": ("arco", "none", "before", 3, False, "forward", "_none"),
    "wo_adaptive": ("arco", "fixed", "before", 3, False, "forward", "_fixed"),
    "wo_prefix": ("arco", "adaptive", "none", 3, False, "forward", "_noprefix"),
    "frozen_mu": ("arco", "adaptive", "before", 3, True, "forward", None),
    "release": ("arco", "adaptive", "after", 3, False, "reverse", None),
    **{
        f"k{k}": ("arco", "adaptive", "before", k, False, "forward", f"_k{k}") for k in (1, 2, 4, 5)
    },
}


def test_every_variant_file_is_expected_here():
    assert variant_names() == sorted(EXPECTED)
    assert len(PAPER) == 6  # Qwen3-4B and Llama-3.2-3B × HotpotQA, 2Wiki, MuSiQue


@pytest.mark.parametrize("variant", sorted(EXPECTED))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_variant_over_config(config, variant):
    base = load_variant(config, [], None)
    c = load_variant(config, [], variant)
    method, mode, prefix, k, frozen, kl, warm = EXPECTED[variant]
    assert (c.method, c.rubric_mode, c.rubric.prefix, c.rubric.k) == (method, mode, prefix, k)
    assert (c.mu_frozen, c.rl.kl_direction) == (frozen, kl)
    assert c.rl.freeze_rubric == (variant == "frozen_mu")  # the key as set: no method writes it
    assert c.rubric.mode == ("adaptive" if variant == "prm" else mode)
    assert c.rl.invalid_bucket == (variant != "release")
    assert c.run_dir == f"{base.run_dir}/{variant}"
    if warm is None:
        assert c.warmup_dir == base.warmup_dir and c.warmup.policy_from == ""
    else:  # its own μ warmup on the base warmup's π
        assert c.warmup_dir == base.warmup_dir + warm
        assert c.warmup.policy_from == base.warmup_dir
    if mode == "fixed":
        assert len(read_criteria_file(str(ROOT / c.rubric.criteria_file), c.rubric.k)) == k
    # everything else is the base config's: the paper's values stay
    assert (c.assets, c.env, c.agent, c.lora) == (base.assets, base.env, base.agent, base.lora)
    assert c.steps == base.steps and c.rl.pi_lr_sparse == base.rl.pi_lr_sparse
    assert (c.rl.sparse_steps, c.rl.dense_steps) == (base.rl.sparse_steps, base.rl.dense_steps)
    if variant == "outcome_only":  # every step a sparse one, π's switch where ARCO's is
        assert (c.sparse_steps, c.dense_steps) == (base.steps, 0)
    else:
        assert (c.sparse_steps, c.dense_steps) == (base.rl.sparse_steps, base.rl.dense_steps)
    assert c.pi_switch_step == base.pi_switch_step == base.rl.sparse_steps


def test_command_line_keys_win_and_placeholders_follow_them():
    cfg = ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml"
    c = load_variant(cfg, ["run_dir=runs/x", "rubric.k=4"], "wo_prefix")
    assert c.run_dir == "runs/x" and c.rubric.k == 4 and c.rubric.prefix == "none"
    over = variant_overrides("prm", load_variant(cfg, ["warmup_dir=w"], None))
    assert over == ['method="prm"', f'run_dir="{load_variant(cfg, [], None).run_dir}/prm"',
                    'warmup_dir="w_none"', 'warmup.policy_from="w"']  # fmt: skip
    with pytest.raises(ValueError, match="--variant nope: no .* choose one of"):
        load_variant(cfg, [], "nope")


def test_a_variant_warmup_replays_the_base_warmups_teacher_cache():
    from arco.warmup import teacher_cache

    cfg = ROOT / "arco" / "configs" / "llama3.2_3b_musique.yaml"
    base = load_variant(cfg, [], None)
    assert teacher_cache(base) == Path("runs/cache/llm")  # warmup.api_cache_dir: shared
    for variant in ("prm", "wo_adaptive", "k5"):  # content-keyed: the same requests cost nothing
        assert teacher_cache(load_variant(cfg, [], variant)) == teacher_cache(base)
    # warmup.api_cache_dir='': the warmup's own cache, and a variant reads its base warmup's
    own = load_variant(cfg, ["warmup.api_cache_dir=''"], None)
    assert teacher_cache(own) == Path(own.warmup_dir) / "teacher_cache"
    for variant in ("prm", "wo_adaptive", "k5"):
        assert teacher_cache(load_variant(cfg, ["warmup.api_cache_dir=''"], variant)) == (
            teacher_cache(own)
        )


@pytest.mark.parametrize(("schedule", "switch"), [("arco", 375), ("sparse", 535)])
def test_outcome_only_keeps_arcos_lr_and_kl_schedule_by_default(schedule, switch):
    """Its 535 GRPO steps switch π's lr (1e-5 -> 3e-6) and KL (0 -> 0.05) where ARCO's dense
    phase starts; outcome_schedule=sparse keeps the sparse lr and no KL throughout."""
    cfg = load_config(
        ArcoConfig,
        ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml",
        ["method=outcome_only", f"rl.outcome_schedule={schedule}"],
    )
    assert (cfg.sparse_steps, cfg.dense_steps, cfg.steps) == (535, 0, 535)
    assert cfg.pi_switch_step == switch and cfg.rl.pi_dense_from == -1
    pinned = load_config(
        ArcoConfig,
        ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml",
        ["method=outcome_only", f"rl.outcome_schedule={schedule}", "rl.pi_dense_from=100"],
    )
    assert pinned.pi_switch_step == 100  # a step set is the step
    tiny = ROOT / "arco" / "configs" / "tiny.yaml"
    assert load_config(ArcoConfig, tiny, ["rl.sparse_steps=3"]).pi_switch_step == 3


@pytest.mark.parametrize("name", ["../tiny", "../configs/tiny", "/etc/passwd", "wo_prefix/", ""])
def test_a_variant_must_be_a_name_one_line_exit_2(name, capsys):
    """``--variant ../tiny`` once loaded the base config as a variant (KeyError: 'question')."""
    from arco.cli import main

    if name:
        with pytest.raises(ValueError, match="not a variant name"):
            variant_overrides(name, load_config(ArcoConfig, Path("arco/configs/tiny.yaml")))
    code = main(["train", "--config", "arco/configs/tiny.yaml", "--variant", name or ".."])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "not a variant name" in err, err
