"""The all-zero setting (eviback/configs/tiny_allzero.yaml): the kind filter, the compare spec, and
the logged all-zero share and backoff share of |advantage| on hand-built groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.config import ConfigError, load_config
from eviback.assets import keep_where, load_questions, select_questions
from eviback.backoff import backoff_metrics
from eviback.config import EviBackConfig, TeacherConfig
from eviback.oracle import EvidenceOracle
from eviback.reward import fallback_advantage_share, scaled_group_advantages
from eviback.trainer import teacher_backoff
from tests.eviback.test_eviback_backoff import EXAMPLES, rollout

ROOT = Path(__file__).resolve().parents[2]
ALLZERO = ROOT / "eviback" / "configs" / "tiny_allzero.yaml"
TINY = ROOT / "eviback" / "configs" / "tiny.yaml"

# one row per kind of the tiny world (type, hops, relation)
ROWS = [
    ("s1", "single_hop", 1, "birthplace"),
    ("b2", "bridge", 2, "birth_country"),
    ("b2y", "bridge", 2, "director_birth_year"),
    ("b3a", "bridge", 3, "director_birth_country"),
    ("b3b", "bridge", 3, "birth_country_capital"),
    ("c2", "comparison", 2, "person_older"),
    ("b2n", "bridge", 2, "capital_population"),
    ("c2c", "comparison", 2, "city_larger"),
    ("c2f", "comparison", 2, "film_earlier"),
    ("c2o", "comparison", 2, "organisation_older"),
    ("y1", "yes_no", 1, "born_in_city"),
]


def qa_file(path: Path) -> Path:
    with path.open("w") as f:
        for qid, qtype, hops, relation in ROWS:
            meta = {"type": qtype, "hops": hops, "relation": relation, "supporting_ids": ["d"]}
            row = {"id": qid, "question": f"{qid}?", "golden_answers": ["x"], "metadata": meta}
            f.write(json.dumps(row) + "\n")
    return path


def test_allzero_config_extends_tiny_and_keeps_only_the_hard_relations(tmp_path):
    cfg = load_config(EviBackConfig, ALLZERO)
    tiny = load_config(EviBackConfig, TINY)
    hard = ["director_birth_year", "capital_population", "city_larger", "film_earlier",
            "organisation_older", "person_older"]  # fmt: skip
    assert cfg.assets.train_where == {"relation": hard}
    assert cfg.assets.dev_where == cfg.assets.train_where
    # everything else is the tiny setting: same warmup, loop and teacher (λ = 0.1)
    assert (cfg.assets.model, cfg.teacher, cfg.train, cfg.agent) == (
        tiny.assets.model, tiny.teacher, tiny.train, tiny.agent,
    )  # fmt: skip
    assert (cfg.n, cfg.questions_per_step, cfg.steps) == (tiny.n, tiny.questions_per_step, 30)
    qa = str(qa_file(tmp_path / "train.jsonl"))
    cfg = load_config(EviBackConfig, ALLZERO, [f"assets.train={{tiny: {qa}}}"])
    # of the eleven rows: the year and number bridges and the four comparisons; not the single
    # hop, the city bridge, the 3-hop bridges nor yes/no
    kept = ["tiny:b2y", "tiny:c2", "tiny:b2n", "tiny:c2c", "tiny:c2f", "tiny:c2o"]
    assert [ex.id for ex in select_questions(cfg.assets, "train", 0)] == kept
    # the dev filter, as the trainer reads the dev files
    dev = load_questions({"tiny": qa}, {}, 0, where=cfg.assets.dev_where, where_key="dev_where")
    assert [ex.id for ex in dev] == kept
    # the default keeps all eleven
    plain = load_config(EviBackConfig, TINY, [f"assets.train={{tiny: {qa}}}"])
    assert len(select_questions(plain.assets, "train", 0)) == 11


def test_keep_where_matches_values_as_text_and_records_them():
    from common.data import QAExample

    exs = [QAExample(q, "?", ["x"], {"type": t, "hops": h, "relation": r}) for q, t, h, r in ROWS]
    matched: set[tuple[str, str]] = set()
    kept = keep_where(exs, {"type": ["bridge", "comparison"], "hops": ["2"]}, matched)
    assert [ex.id for ex in kept] == ["b2", "b2y", "c2", "b2n", "c2c", "c2f", "c2o"]
    assert matched == {("type", "bridge"), ("type", "comparison"), ("hops", "2")}
    assert [ex.id for ex in keep_where(exs, {"relation": ["person_older", "birthplace"]})] == [
        "s1",
        "c2",
    ]


def test_a_filter_value_that_matches_nothing_and_an_empty_list_are_errors(tmp_path):
    qa = str(qa_file(tmp_path / "train.jsonl"))
    with pytest.raises(ValueError, match=r"assets.train_where: hops=4 matches no question"):
        load_questions({"tiny": qa}, {}, 0, where={"type": ["bridge"], "hops": ["3", "4"]})
    # a misspelt relation is named, not silently dropped
    with pytest.raises(ValueError, match=r"relation=person_oldr matches no question"):
        load_questions({"tiny": qa}, {}, 0, where={"relation": ["person_older", "person_oldr"]})
    with pytest.raises(ConfigError, match="assets.dev_where.type must list at least one"):
        load_config(EviBackConfig, ALLZERO, ["assets.dev_where={type: []}"])


def test_all_zero_share_and_backoff_share_of_advantage_on_hand_built_groups():
    # q1: all four rollouts wrong -> fallback, rewards 0.2, 0.1, 0, 0 (test_eviback_backoff);
    # q2: one right of two -> EM 1, 0
    trajs = [
        rollout("q1", 0, "Bob", [["a"], ["b"]]),
        rollout("q1", 1, "Bob", [["a", "b"]], invalid=1),
        rollout("q1", 2, "Bob", [["a", "x"]]),
        rollout("q1", 3, "Bob", []),
        rollout("q2", 0, "Rome", [["x"]]),
        rollout("q2", 1, "Paris", [["x"]]),
    ]
    b = teacher_backoff(trajs, EXAMPLES, EvidenceOracle(5), TeacherConfig(lam=1.0))
    assert backoff_metrics(b)["all_zero_share"] == 0.5  # 1 of 2 groups
    adv = scaled_group_advantages(b.rewards, [t.group_id for t in trajs], b.scales)
    # q1 at λ = 1: r = (0.2, 0.1, 0, 0), mean 0.075, sample std sqrt(0.0275/3) = 0.09574:
    # |z| = (1.3056, 0.2611, 0.7833, 0.7833), sum 3.1334; q2: (1, 0) -> ±0.7071, sum 1.4142
    assert adv[:4].abs().sum().item() == pytest.approx(3.1334, abs=1e-3)
    assert adv[4:].abs().sum().item() == pytest.approx(1.4142, abs=1e-3)
    share = fallback_advantage_share(adv, b.fell_back)
    assert share == pytest.approx(3.1334 / (3.1334 + 1.4142), abs=1e-3)  # 0.689
    # λ = 0.1 scales the fallback group's mass by 0.1: 0.31334 / (0.31334 + 1.4142) = 0.181
    b01 = teacher_backoff(trajs, EXAMPLES, EvidenceOracle(5), TeacherConfig(lam=0.1))
    adv01 = scaled_group_advantages(b01.rewards, [t.group_id for t in trajs], b01.scales)
    assert fallback_advantage_share(adv01, b01.fell_back) == pytest.approx(0.1814, abs=1e-3)
    # no fallback groups, or every advantage 0
    assert fallback_advantage_share(adv, [False] * 6) == 0.0
    assert fallback_advantage_share(torch.zeros(6), b.fell_back) == 0.0


def test_compare_spec_allzero_runs_the_lambda_ablation_against_search_r1():
    from experiments.compare import load_spec

    spec = load_spec(ROOT / "eviback" / "configs" / "compare_allzero.yaml")
    names = [a["name"] for a in spec["arms"]]
    assert names == ["search_r1", "eviback_lam0.1", "eviback_lam0.3", "eviback_lam1.0"]
    assert (spec["seeds"], spec["metric"], spec["baseline"]) == ([0, 1, 2], "f1", "search_r1")
    for arm in spec["arms"]:
        assert arm["command"][-2:] == ["--config", "eviback/configs/tiny_allzero.yaml"]
    overrides = [a["overrides"] for a in spec["arms"]]
    assert overrides == [
        ["teacher.enabled=false"],
        ["teacher.lam=0.1"],
        ["teacher.lam=0.3"],
        ["teacher.lam=1.0"],
    ]
    assert "all_zero_share" in spec["extra_metrics"]
    assert "backoff_adv_share" in spec["extra_metrics"]


@pytest.mark.parametrize(
    ("target", "marker"),
    [
        ("compare-eviback-allzero", "--spec eviback/configs/compare_allzero.yaml"),
        ("compare-eviback-allzero-smoke", "--out runs/compare/eviback_allzero_smoke --seeds 0"),
    ],
)
def test_make_targets_run_the_allzero_spec(target, marker):
    from tests.test_makefile import dry_run

    lines = " ".join(dry_run("-B", target)).replace("\\", " ")
    assert "-m experiments.compare" in lines and marker in " ".join(lines.split())


def test_compare_spec_cer_backoff_sets_the_backoff_over_cer_against_cer_alone():
    from cer.rewards.search_agent import AgentCER
    from eviback.backoff import BackoffOver, reward_of, teacher_backoff_reward
    from experiments.compare import load_spec
    from tests.test_makefile import dry_run

    spec = load_spec(ROOT / "eviback" / "configs" / "compare_cer_backoff.yaml")
    assert [a["name"] for a in spec["arms"]] == ["cer", "eviback_cer", "search_r1", "eviback"]
    assert (spec["seeds"], spec["metric"], spec["baseline"]) == ([0, 1, 2], "f1", "cer")
    built = {}
    for arm in spec["arms"]:
        assert arm["command"][-2:] == ["--config", "eviback/configs/tiny_allzero.yaml"]
        cfg = load_config(EviBackConfig, ROOT / arm["command"][-1], arm["overrides"])
        built[arm["name"]] = (cfg.teacher.enabled, reward_of(cfg.reward))
    for name in ("cer", "eviback_cer"):
        enabled, fn = built[name]
        assert isinstance(fn, BackoffOver) and isinstance(fn.base, AgentCER)
        assert enabled == (name == "eviback_cer")
    assert built["search_r1"] == (False, teacher_backoff_reward)
    assert built["eviback"] == (True, teacher_backoff_reward)
    lines = " ".join(dry_run("-B", "compare-eviback-cer")).replace("\\", " ")
    assert "--spec eviback/configs/compare_cer_backoff.yaml" in lines
