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
    assert sum(c.assets.eval_quotas.values()) == 3500 and len(c.assets.eval_files) == 7
    assert (c.teacher.beta, c.teacher.gamma, c.teacher.lam, c.teacher.top_m) == (0.1, 0.1, 0.1, 5)


def test_tiny_config_is_offline():
    c = load_config(EviBackConfig, CONFIGS / "tiny.yaml")
    assert c.teacher.backend == "oracle" and not c.assets.retrieval_url
    assert c.assets.model == "runs/warmstart/tiny/model"


def test_missing_assets_are_named_with_how_to_get_them(tiny_world, tmp_path, capsys):
    w = tiny_world
    base = [f"assets.model={w / 'model'}", f"assets.train_files={{t: {w / 'train.jsonl'}}}",
            f"assets.dev_files={{t: {w / 'dev.jsonl'}}}", f"assets.corpus={w / 'corpus.jsonl'}",
            f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    cases = {
        "assets.model=runs/nowhere/model": "python -m eviback warmup",
        f"assets.train_files={{nq: {tmp_path / 'nq.jsonl'}}}": "assets.train_files.nq",
        f"assets.corpus={tmp_path / 'none'}": "wiki-18-e5-index",
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
        load_questions(cfg.assets.train_files, cfg.assets.train_quotas, 0)
