"""Paper configs rehearsed end to end by ``python -m experiments.rehearse`` (the user's command), with
their sizes cut further where a stage would dominate ``make test``: CER under two DeepSpeed ranks
(ZeRO-3, bf16), EviBack on Qwen3-0.6B (APE, training with the teacher), ARCO on Llama-3.2-3B
(warmup with the LLM player and annotator, a sparse and a dense step, evaluation) and on
Qwen3-4B-Instruct-2507 over 2Wiki (warmup, training). Each starts from ``make data`` on a
stand-in hub (experiments/rehearse/runner.py ``_through_make_data``) and walks the README's "One
paper run" in its order (EviBack: ``make data-index``, ``make serve-retrieval &``, ``make
wait-services`` first). On a CPU without avx512_bf16 they train in fp32 (precision.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.rehearse.precision import has_bf16, read_cpuinfo
from experiments.rehearse.walk import group_alive, readme_sequences, walked

ROOT = Path(__file__).resolve().parents[2]


def in_readme_order(walk: list[str], method: str) -> bool:
    """``walk`` is the README's sequence for ``method`` with some steps left out, in its order."""
    steps = iter(walked(readme_sequences((ROOT / "README.md").read_text())[method]))
    return all(step in steps for step in walk)


def rehearse(tmp_path: Path, *args: str, timeout: int = 1500) -> dict:
    out = tmp_path / "rehearsal"
    command = [sys.executable, "-m", "experiments.rehearse", *args, "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    report = json.loads((out / "report.json").read_text())
    logs = "\n".join(
        f"--- {s['name']}\n" + Path(s["log"]).read_text()[-4000:]
        for s in report["stages"]
        if not s["ok"]
    )
    assert run.returncode == 0, run.stderr[-3000:] + logs
    assert report["ok"] and (out / "report.md").read_text().splitlines()[2].startswith("PASSED")
    return {s["name"]: s for s in report["stages"]} | {"_report": report}


@pytest.mark.slow
def test_cer_paper_config_on_two_ranks(tmp_path):
    stages = rehearse(
        tmp_path, "--config", "cer/configs/qwen3_4b_base_math.yaml", "--ranks", "2",
        "--stage", "train", "--stage", "resume",
    )  # fmt: skip
    train, resume = stages["train"]["counts"], stages["resume"]["counts"]
    assert train["steps_logged"] == 2 and resume["steps_logged"] == 3
    assert train["reward/cer"] > 0 and train["mixed_group_share"] > 0
    assert train["nonzero_grad_steps"] == 2
    command = stages["train"]["command"]  # the launcher's, or make's where train-cer takes ARGS=
    assert "--num_gpus 2" in command or ("make " in command and " GPUS=2 " in command)
    # ZeRO-3 and no copy of the whole model (no KL, no frozen scorer): partitioned as it loads
    for stage in ("train", "resume"):
        assert "partitioned over 2 ranks as it loads" in Path(stages[stage]["log"]).read_text()
    # both ranks' tokens summed: the update's equal the cost model's for the same shapes
    tokens = {e["category"]: e for e in train["tokens"]}
    for category in ("generation", "update"):
        assert tokens[category]["measured"] == tokens[category]["model"] > 0, category
    assert tokens["reward"]["measured"] > 0 and tokens["reward"]["model"] > 0
    assert [e["steps"] for e in resume["tokens"]] == ["3"] * len(resume["tokens"])
    notes = " ".join(stages["_report"]["notes"])
    precision = "bf16=true" if has_bf16(read_cpuinfo()) else "bf16 -> fp32: this CPU has no"
    assert "sleep_during_update=false" in notes and precision in notes
    assert stages["_report"]["walk"][0] == "data"
    assert in_readme_order(stages["_report"]["walk"], "cer")


@pytest.mark.slow
def test_eviback_paper_config_with_ape_and_the_teacher(tmp_path):
    stages = rehearse(
        tmp_path, "--config", "eviback/configs/qwen3_0.6b.yaml", "--stage", "ape",
        "--stage", "train", "--set", "train:questions_per_step=1",
    )  # fmt: skip
    ape, train = stages["ape"]["counts"], stages["train"]["counts"]
    report = stages["_report"]
    # the README's steps: the index from its hub parts, the server by make, waited for by make
    assert report["walk"] == [
        "data", "data-index", "serve-retrieval", "wait-services", "ape-eviback", "train-eviback"
    ]  # fmt: skip
    assert in_readme_order(report["walk"], "eviback")
    setup = {s["name"]: s for s in report["setup"]}
    assert setup["serve-retrieval"]["ok"] and setup["serve-retrieval"]["command"].startswith(
        "make --no-print-directory serve-retrieval"
    )
    assert not group_alive(setup["serve-retrieval"]["counts"]["pgid"])  # stopped, children too
    assert stages["wait-services"]["command"].startswith("make --no-print-directory wait-services")
    assert stages["ape"]["command"].startswith("make --no-print-directory ape-eviback")
    # training judged with E2E-APE's policy: the run folder records that file
    policy = Path(report["stages"][0]["log"]).parents[1] / "runs/eviback/ape/policy.yaml"
    assert Path(train["teacher_policy_file"]).resolve() == policy.resolve()
    assert any(k.startswith("endpoint/ape_controller/") for k in ape)
    assert train["teacher/calls"] > 0 and train["nonzero_grad_steps"] >= 1
    tokens = {e["category"]: e for e in train["tokens"]}
    assert tokens["update"]["measured"] == tokens["update"]["model"] > 0
    assert tokens["teacher (external)"]["model"] is None
    endpoint = stages["_report"]["endpoint"]["by_outcome"]
    assert endpoint["ok"] > 0 and sum(v for k, v in endpoint.items() if k != "ok") > 0


@pytest.mark.slow
def test_arco_paper_config_on_llama(tmp_path):
    stages = rehearse(
        tmp_path, "--config", "arco/configs/llama3.2_3b_hotpotqa.yaml",
        "--stage", "warmup", "--stage", "train", "--stage", "eval",
    )  # fmt: skip
    warmup, train = stages["warmup"]["counts"], stages["train"]["counts"]
    assert stages["_report"]["walk"] == ["data", "warmup-arco", "train-arco", "eval-arco"]
    assert stages["warmup"]["command"].startswith("make --no-print-directory warmup-arco")
    assert train["warmup_dir"].endswith("runs/arco/warmup")  # training started from it
    assert warmup.get("endpoint/arco_player/ok", 0) > 0
    assert warmup.get("endpoint/arco_annotator/ok", 0) > 0
    assert train["steps_logged"] == 2 and train["nonzero_grad_steps"] >= 1
    standin = stages["_report"]["standin"]
    assert standin["architecture"] == "LlamaForCausalLM" and standin["vocab_size"] == 128_256


@pytest.mark.slow
def test_arco_paper_config_on_qwen3(tmp_path):
    stages = rehearse(
        tmp_path, "--config", "arco/configs/qwen3_4b_2wiki.yaml",
        "--stage", "warmup", "--stage", "train",
    )  # fmt: skip
    train = stages["train"]["counts"]
    assert train["phase_dense"] > 0 and train["nonzero_grad_steps"] >= 1
    assert stages["_report"]["standin"]["architecture"] == "Qwen3ForCausalLM"
    # its data came through `make data`'s code: the config's seeded 2,000-question draw
    notes = " ".join(stages["_report"]["notes"])
    assert "made by `make data`" in notes and "3 key(s) drawn by its seeded rule" in notes
    assert "/project/data/2wiki/train_2000.json" in stages["warmup"]["command"]
