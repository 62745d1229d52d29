"""`eviback train` and `eviback eval` end to end on the tiny world (HF engine, a few steps)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from common.config import load_config
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "eviback_two_ranks.py"


@pytest.fixture(scope="module")
def warm(tiny_world, tmp_path_factory):
    """A briefly warmed-up actor, so that it searches and the teacher has evidence to judge."""
    from common.warmup import WarmupConfig, run_warmup

    tiny = load_config(EviBackConfig, DEFAULT_CONFIG)
    out = tmp_path_factory.mktemp("warm")
    cfg = WarmupConfig(world=str(tiny_world), out=str(out), steps=60, batch_size=8,
                          agent=tiny.agent)  # fmt: skip
    return run_warmup(cfg)


def overrides(world, model, run_dir, *extra: str) -> list[str]:
    return [
        f"assets.model={model}",
        f"assets.train={{tiny: {world / 'train.jsonl'}}}",
        f"assets.dev={{tiny: {world / 'dev.jsonl'}}}",
        # mappings merge with tiny.yaml's: give both of its benchmarks
        f"assets.eval={{tiny_dev: {world / 'dev.jsonl'}, tiny_test: {world / 'test.jsonl'}}}",
        "assets.eval_quotas={tiny_dev: 3, tiny_test: 3}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"run_dir={run_dir}",
        "steps=2", "questions_per_step=2", "n=4", "eval_every=100", "eval_questions=2",
        "loss.micro_batch_size=8", "engine.backend=hf", *extra,
    ]  # fmt: skip


def step_rows(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r for r in rows if "reward" in r]


def test_eviback_and_baseline_train_then_eval_with_bootstrap(
    tiny_world, warm, tmp_path, launch_two_ranks
):
    from eviback.assets import select_questions
    from eviback.evaluate import run_eval
    from eviback.trainer import train_eviback

    runs = {}
    for name, extra in (("eviback", ()), ("baseline", ("teacher.enabled=false",))):
        cfg = load_config(
            EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, tmp_path / name, *extra)
        )
        out = train_eviback(cfg)
        runs[name] = tmp_path / name
        assert [e["step"] for e in out["evals"]] == [0, 2]
        assert (tmp_path / name / "checkpoints" / "step_2").is_dir()
    evi, base = step_rows(runs["eviback"]), step_rows(runs["baseline"])
    assert [r["step"] for r in evi] == [1, 2]
    for r in base:  # teacher off: the reward is EM, the teacher never asked
        assert r["teacher/items"] == 0 and r["reward"] == pytest.approx(r["em"])
    for r in evi:
        assert 0 <= r["all_zero_share"] <= 1
        mix = r["teacher/S"] + r["teacher/I"] + r["teacher/A"] + r["teacher/invalid"]
        assert mix == pytest.approx(1.0) if r["teacher/items"] else mix == 0
    assert sum(r["teacher/items"] for r in evi) > 0  # the warm actor searched in all-zero groups
    samples = json.loads((runs["eviback"] / "samples" / "step_00001.json").read_text())
    for s in samples:
        searched = any(st["kind"] == "search" and st["docs"] for st in s["steps"])
        assert (s["verdict"] is not None) == (s["fell_back"] and searched)
        if s["fell_back"]:
            assert s["reward"] in (0.0, pytest.approx(0.1)) or 0.1 < s["reward"] <= 0.2

    base_cfg = load_config(
        EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, runs["baseline"])
    )
    run_eval(base_cfg)
    evi_cfg = load_config(
        EviBackConfig,
        DEFAULT_CONFIG,
        overrides(tiny_world, warm, runs["eviback"],
                  f"eval.compare_to={runs['baseline'] / 'eval' / 'per_question.jsonl'}",
                  "eval.bootstrap_resamples=1000"),
    )  # fmt: skip
    report = run_eval(evi_cfg)
    assert report["model"].endswith("step_2")
    assert report["summary"]["all"]["n"] == 6 and report["summary"]["tiny_dev"]["n"] == 3
    (f1,) = [c for c in report["comparisons"] if c["metric"] == "f1"]
    assert f1["n"] == 6 and f1["ci_low"] <= f1["delta"] <= f1["ci_high"]
    assert (runs["eviback"] / "eval" / "table.md").read_text().startswith("| benchmark |")

    # Two ranks in one launch: the EviBack run trained again (a micro-batch of 4: each rank's
    # share is 1 question x 4), then the same evaluation (each its own engine on every other
    # question): rank 0 writes the gathered results, in question order, equal to the
    # one-process run's.
    sharded, trained = tmp_path / "sharded", tmp_path / "two_ranks"
    args = [str(SCRIPT),
            "train", "--config", DEFAULT_CONFIG,
            *overrides(tiny_world, warm, trained, "loss.micro_batch_size=4"),
            "--then", "eval", "--config", DEFAULT_CONFIG,
            *overrides(tiny_world, warm, sharded),
            f"eval.model={runs['baseline'] / 'checkpoints' / 'step_2'}"]  # fmt: skip
    run = launch_two_ranks(args, torchrun=True)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    one = (runs["baseline"] / "eval" / "per_question.jsonl").read_text()
    assert (sharded / "eval" / "per_question.jsonl").read_text() == one
    assert run.stdout.count("| benchmark |") == 1  # printed by rank 0 only
    # the batch is global: each step's questions over both ranks, in rank order, are the ones
    # the one-process run drew (the seed's shuffle of the train set, 2 a step), 2 x 4 rollouts
    cfg = load_config(EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, trained))
    train_set = select_questions(cfg.assets, "train", cfg.seed)
    order = list(range(len(train_set)))
    random.Random(cfg.seed).shuffle(order)
    want = [
        {"step": s, "ids": [train_set[order[2 * s - 2]].id, train_set[order[2 * s - 1]].id],
         "trajectories": 8}
        for s in (1, 2)
    ]  # fmt: skip
    for run_dir in (runs["eviback"], trained):
        assert [json.loads(x) for x in (run_dir / "batches.jsonl").open()] == want


def test_the_backoff_over_a_cer_base_trains(tiny_world, warm, tmp_path):
    """reward.base=cer.rewards.search_agent:AgentCER, one step: every rollout outside the fallback
    groups carries CER's reward (a probability, 0 without an answer), every fallback rollout the
    teacher's, and CER's metrics are logged beside the backoff's."""
    from eviback.trainer import train_eviback

    run_dir = tmp_path / "cer_base"
    extra = ("reward.base=cer.rewards.search_agent:AgentCER", "steps=1", "eval_every=0",
             "samples_per_step=8")  # fmt: skip
    cfg = load_config(EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, run_dir, *extra))
    train_eviback(cfg)
    (row,) = step_rows(run_dir)
    assert "cer/ref_prob_mean" in row and 0 <= row["all_zero_share"] <= 1
    samples = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert len(samples) == 8  # the batch's 2 groups of 4
    for s in samples:
        if s["fell_back"]:
            assert s["reward"] == 0.0 or 0.1 - 1e-6 <= s["reward"] <= 0.2 + 1e-6
        elif s["answer"] is None:
            assert s["reward"] == 0.0
        else:
            assert 0.0 <= s["reward"] <= 1.0
    kept = [s for s in samples if not s["fell_back"] and s["answer"] is not None]
    # CER is soft: a kept rollout's reward is not its EM (a wrong answer earns π(a*|s) > 0)
    assert any(s["reward"] not in (0.0, 1.0) for s in kept) or not kept


def llm_teacher(url: str, model: str = "judge") -> list[str]:
    return ["teacher.backend=llm", f"assets.teacher_endpoint={url}",
            f"assets.teacher_model={model}", "teacher.retries=1", "teacher.backoff=0.01",
            "teacher.timeout=5"]  # fmt: skip


@pytest.mark.parametrize("fault", ["http_503", "malformed"])
def test_a_teacher_that_fails_or_never_parses_stops_the_run_at_its_first_step(
    tiny_world, warm, tmp_path, fault
):
    """Every teacher request fails (503 after its retries), or every reply breaks the verdict
    contract: before, the run trained to the end as the Search-R1 baseline and exited 0."""
    from common.launcher import RunStopped
    from eviback.trainer import train_eviback
    from experiments.rehearse.endpoint import serve_endpoint

    run_dir = tmp_path / "run"
    with serve_endpoint(**{fault: 1.0}, served=["judge"]) as url:
        cfg = load_config(
            EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, run_dir, *llm_teacher(url))
        )
        with pytest.raises(RunStopped) as stop:
            train_eviback(cfg)
    message = str(stop.value)
    assert message.startswith("step 1: 100% of the teacher's stage A (gold-blind) requests (")
    assert f" over all ranks) to {url} (model judge) failed" in message
    assert "teacher.max_failure_share=0.5" in message
    assert step_rows(run_dir) == []  # the refused step is neither logged
    assert not (run_dir / "checkpoints").exists()  # nor saved
    assert not list((run_dir / "teacher_cache").rglob("*.json"))  # no broken reply cached


def step_questions(world, step: int, per_step: int = 2) -> list[str]:
    """The questions step ``step`` draws (the seed's shuffle of the train set, ``per_step`` a
    step), as ``train_eviback`` draws them in one process."""
    from eviback.assets import select_questions

    cfg = load_config(EviBackConfig, DEFAULT_CONFIG, overrides(world, world / "model", "x"))
    train_set = select_questions(cfg.assets, "train", cfg.seed)
    order = list(range(len(train_set)))
    random.Random(cfg.seed).shuffle(order)
    first = (step - 1) * per_step
    return [train_set[i].question for i in order[first : first + per_step]]


def test_a_teacher_stage_down_from_step_2_stops_before_the_update_and_saves_step_1(
    tiny_world, warm, tmp_path
):
    """The endpoint answers step 1 and fails (503, after the retries) every stage-B request of
    step 2: the gold-aware stage down, stage A well. Before, the share of the step's requests
    that failed was 8 of 16, not over 0.5: step 2 trained on stage A's verdicts alone and the
    run ended with exit 0; and a stop came after the step's update, so step 1 (save_every=0:
    only the last step is saved) was lost (measured with the whole teacher down in step 2).
    Now each stage's share counts on its own, decided before the update: step 1 is saved and
    logged, and a resume starts at step 2."""
    from common.launcher import RunStopped
    from eviback.trainer import train_eviback
    from experiments.rehearse.endpoint import serve_endpoint

    run_dir = tmp_path / "run"
    # the tiny world's answers: stage A's rule finds one in the documents, so stage B is asked
    answers = {
        a for x in (tiny_world / "train.jsonl").open() for a in json.loads(x)["golden_answers"]
    }
    faults = {
        "fail_only": ("eviback_stage_b",),
        "fail_matching": step_questions(tiny_world, 2),
        "answers": sorted(answers),
    }
    with serve_endpoint(http_503=1.0, served=["judge"], **faults) as url:
        cfg = load_config(
            EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, warm, run_dir, *llm_teacher(url))
        )
        with pytest.raises(RunStopped) as stop:
            train_eviback(cfg)
    assert str(stop.value).startswith("step 2: 100% of the teacher's stage B (gold-aware) requests")
    assert "stage A (gold-blind): 0% of" in str(stop.value)
    assert "\n" not in str(stop.value)
    (row,) = step_rows(run_dir)  # step 1 logged, step 2 not
    assert row["step"] == 1 and row["teacher/calls"] > 0 and row["teacher/failure_share"] == 0
    assert row["teacher/calls"] == 2 * row["teacher/items"]  # stage B was asked in step 1
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == ["step_1"]


def test_a_wrong_teacher_model_name_stops_before_any_model_loads(tiny_world, tmp_path, monkeypatch):
    from common.launcher import RunStopped
    from eviback import trainer
    from experiments.rehearse.endpoint import serve_endpoint

    def no_load(*a, **k):
        raise AssertionError("a model loaded before the teacher was probed")

    monkeypatch.setattr(trainer, "load_for_training", no_load)
    with serve_endpoint(served=["judge"]) as url:
        cfg = load_config(
            EviBackConfig,
            DEFAULT_CONFIG,
            overrides(
                tiny_world, tiny_world / "model", tmp_path / "run", *llm_teacher(url, "jduge")
            ),
        )
        with pytest.raises(RunStopped, match=r"serves \['judge', 'standin'\], not 'jduge'"):
            trainer.train_eviback(cfg)


def test_a_retrieval_server_that_does_not_answer_stops_before_any_model_loads(
    tiny_world, tmp_path, monkeypatch, free_port
):
    from common.launcher import RunStopped
    from eviback import trainer

    def no_load(*a, **k):
        raise AssertionError("a model loaded before the retrieval server was probed")

    monkeypatch.setattr(trainer, "load_for_training", no_load)
    url = f"http://127.0.0.1:{free_port()}"
    cfg = load_config(
        EviBackConfig,
        DEFAULT_CONFIG,
        overrides(
            tiny_world, tiny_world / "model", tmp_path / "run", f"assets.retrieval_url={url}"
        ),
    )
    with pytest.raises(RunStopped, match=f"retrieval server {url}/retrieve does not answer"):
        trainer.train_eviback(cfg)
