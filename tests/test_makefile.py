"""The Makefile's commands, read with make's dry run (``make -n``: printed, nothing trained)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from common.config import load_config

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

# every target that hands a seed to a trainer, at a paper scale where there is one
SEEDED = [
    ("train-eviback", "SCALE=1.7b", "eviback train --config eviback/configs/qwen3_1.7b.yaml"),
    ("train-eviback-baseline", "SCALE=1.7b", "run_dir=runs/eviback/1.7b-baseline"),
    ("train-cer", "SCALE=4b", "cer train --config cer/configs/qwen3_4b_base_math.yaml"),
    ("train-cer-baseline", "SCALE=4b", "run_dir=runs/cer/qwen3_4b_base_math_rule"),
    ("warmup-arco", "SCALE=qwen3-4b", "arco warmup --config arco/configs/qwen3_4b_hotpotqa.yaml"),
    ("train-arco", "SCALE=qwen3-4b", "arco train --config arco/configs/qwen3_4b_hotpotqa.yaml"),
    ("train-grpo", "SCALE=tiny", "common.search_grpo --config common/configs/grpo_tiny.yaml"),
]


def dry_run(*args: str) -> list[str]:
    """The commands ``make -n ARGS`` would run, SEED unset in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("SEED", "MAKEFLAGS", "MAKELEVEL")}
    run = subprocess.run(
        ["make", "-n", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def trainer_line(lines: list[str], marker: str) -> str:
    (line,) = [x for x in lines if marker in x]
    return line


def test_train_eviback_keeps_the_configs_seed_unless_seed_is_set():
    line = trainer_line(dry_run("train-eviback", "SCALE=1.7b"), "eviback train")
    assert "seed=" not in line  # the config's seed: 42, the release's
    line = trainer_line(dry_run("train-eviback", "SCALE=1.7b", "SEED=3"), "eviback train")
    assert line.split()[-1] == "seed=3"


@pytest.mark.parametrize(("target", "scale", "marker"), SEEDED)
def test_every_seeded_target_passes_seed_only_when_set(target, scale, marker):
    lines = dry_run(target, scale)
    assert not any("seed=" in x for x in lines), lines
    line = trainer_line(dry_run(target, scale, "SEED=0"), marker)  # 0 is a seed too
    assert line.split()[-1] == "seed=0"


def test_the_paper_configs_carry_their_releases_seed():
    """EviBack's release trains with seed 42 (0.6B and 4B inherit the 1.7B config); ARCO's
    release seeds its SFT and data split with 42 (it ships HotpotQA + Qwen3-4B; the other five
    settings follow it)."""
    from arco.config import ArcoConfig
    from eviback.config import EviBackConfig

    for scale in ("0.6b", "1.7b", "4b"):
        cfg = load_config(EviBackConfig, ROOT / "eviback" / "configs" / f"qwen3_{scale}.yaml", [])
        assert cfg.seed == 42, scale
    for backbone in ("qwen3_4b", "llama3.2_3b"):
        for data in ("hotpotqa", "2wiki", "musique"):
            path = ROOT / "arco" / "configs" / f"{backbone}_{data}.yaml"
            assert load_config(ArcoConfig, path, []).seed == 42, path.name


# the cross-method tools' targets: the same names, their commands now under experiments/
EXPERIMENTS = [
    (
        "eval-all",
        "experiments.evaluate_all runs --out runs/eval --ranks 1 --retrieval-index data/search_r1",
    ),
    ("compare-grpo", "experiments.compare --spec common/configs/compare_grpo_tiny.yaml"),
    ("compare-eviback", "experiments.compare --spec eviback/configs/compare_tiny.yaml"),
    ("compare-cer", "experiments.compare --spec cer/configs/compare_tiny.yaml"),
    ("compare-arco", "experiments.compare --spec arco/configs/compare_tiny.yaml"),
    ("compare-arco-smoke", "experiments.compare --spec arco/configs/compare_tiny.yaml --out"),
    ("compare-arco-teacher-steps", "experiments.compare --spec arco/configs/compare_step_scorer"),
    ("compare-eviback-cer", "experiments.compare --spec eviback/configs/compare_cer_backoff"),
    ("compare-eviback-teacher", "experiments.compare --spec eviback/configs/compare_teacher"),
    ("compare-cer-selfverify", "experiments.compare --spec cer/configs/compare_selfverify"),
    ("compare-arco-long", "experiments.compare --spec arco/configs/compare_long"),
    ("compare-arco-paths", "experiments.compare --spec arco/configs/compare_paths"),
    ("compare-grpo-dense", "experiments.compare --spec common/configs/compare_grpo_dense_tiny"),
    ("demo", "experiments.demo --world runs/tinyworld/seed0"),
    ("demo", "experiments.demo_report --out runs/demo"),
]


@pytest.mark.parametrize(("target", "marker"), EXPERIMENTS)
def test_cross_method_targets_run_the_experiments_modules(target, marker):
    # -B: every prerequisite's commands too, as if nothing were built yet
    lines = dry_run("-B", target)
    (line,) = [x for x in lines if marker in x]
    assert line.split()[:2] == [".venv/bin/python", "-m"]
    assert (ROOT / (line.split()[2].replace(".", "/") + ".py")).is_file()
    assert not any(" -m common.compare" in x or " -m common.evaluate_all" in x for x in lines)
    assert not any(" -m common.demo" in x for x in lines)


def test_the_hard_settings_build_their_own_warmups():
    def text(target: str) -> str:  # continuation lines joined
        return " ".join(x.rstrip("\\").strip() for x in dry_run("-B", target))

    cer = text("compare-cer-selfverify")
    assert "cer build-tiny --out runs/cer/tiny_selfverify/task --canonical-share 0.9" in cer
    assert "cer warmup --config cer/configs/tiny_selfverify.yaml" in cer
    arco = text("compare-arco-long")
    long = "--config arco/configs/tiny_long.yaml warmup_dir=runs/compare/arco_long/warmup"
    assert f"{long}/arco " in arco
    prm = f"{long}/none warmup.policy_from=runs/compare/arco_long/warmup/arco rubric.mode=none"
    assert prm in arco


LAUNCHED = [
    ("train-cer", "SCALE=4b", "cer train --config cer/configs/qwen3_4b_base_math.yaml"),
    ("train-cer-baseline", "SCALE=8b", "reward.type=rule"),
    ("eval-cer", "SCALE=4b", "cer eval --config cer/configs/qwen3_4b_base_math.yaml"),
    ("train-eviback", "SCALE=1.7b", "eviback train --config eviback/configs/qwen3_1.7b.yaml"),
    ("train-eviback-baseline", "SCALE=1.7b", "teacher.enabled=false"),
    ("eval-eviback", "SCALE=1.7b", "eviback eval --config eviback/configs/qwen3_1.7b.yaml"),
    ("train-arco", "SCALE=qwen3-4b", "arco train --config arco/configs/qwen3_4b_hotpotqa.yaml"),
    ("eval-arco", "SCALE=qwen3-4b", "arco eval --config arco/configs/qwen3_4b_hotpotqa.yaml"),
    # ARCO's warmup trains pi and mu as its RL does: on GPUS= / HOSTFILE= too
    ("warmup-arco", "SCALE=qwen3-4b", "arco warmup --config arco/configs/qwen3_4b_hotpotqa.yaml"),
]


@pytest.mark.parametrize(("target", "scale", "marker"), LAUNCHED)
def test_gpus_and_hostfile_run_the_target_under_the_deepspeed_launcher(target, scale, marker):
    (one,) = [x for x in dry_run(target, scale) if marker in x]
    assert one.startswith(".venv/bin/python -m ") and "deepspeed" not in one
    (eight,) = [x for x in dry_run(target, scale, "GPUS=8") if marker in x]
    assert eight.split()[:4] == [".venv/bin/deepspeed", "--num_gpus", "8", "--module"]
    assert eight.split()[4:] == one.split()[2:]  # the same command, launched
    (nodes,) = [x for x in dry_run(target, scale, "HOSTFILE=hosts", "GPUS=8") if marker in x]
    # the environment for the other nodes' ranks is written first (.deepspeed_env)
    env, launch = nodes.split(" && ")
    assert env == ".venv/bin/python -m common.multinode deepspeed-env"
    assert launch.split()[:6] == [
        ".venv/bin/deepspeed", "--hostfile", "hosts", "--num_gpus", "8", "--module"
    ]  # fmt: skip
    assert launch.split()[6:] == one.split()[2:]


def test_the_servers_start_on_the_gpus_and_address_given():
    lines = dry_run("serve-teacher", "TEACHER_GPUS=4,5", "HOST=0.0.0.0")
    command = " ".join(x.rstrip("\\").strip() for x in lines)  # the recipe's continued lines
    assert command.startswith("CUDA_VISIBLE_DEVICES=4,5 .venv/bin/vllm serve zai-org/GLM-4.7-Flash")
    assert "--host 0.0.0.0 --port 8001 --tensor-parallel-size 2 --reasoning-parser glm45" in command
    (retrieval,) = dry_run("serve-retrieval", "INDEX=data/search_r1", "HOST=0.0.0.0")
    assert retrieval == (
        ".venv/bin/python -m common.retrieval serve --index data/search_r1 --host 0.0.0.0 --port 8000"
    )
    # the index it serves is the one `make data-index` makes, in the same folder by default
    (made,) = dry_run("data-index", "HUB=/tmp/hub")
    assert made == (
        ".venv/bin/python -m experiments.prepare_data --search-r1-index data/search_r1 --hub /tmp/hub"
    )


def test_scale_smol_prepares_its_assets_then_trains_every_method():
    lines = dry_run("train-cer", "SCALE=smol")
    assert lines.index("make smol") < lines.index(
        trainer_line(lines, "cer train --config cer/configs/smol.yaml")
    )
    line = trainer_line(dry_run("train-cer-baseline", "SCALE=smol"), "reward.type=rule")
    assert "cer/configs/smol.yaml" in line
    (rule_dir,) = [x for x in dry_run("train-cer-baseline", "SCALE=smol") if "run_dir=" in x]
    assert "run_dir=runs/cer/smol/rule" in rule_dir
    smol = dry_run("smol")
    assert any("common.smol.model --out" in x for x in smol)
    assert any("common.smol.data --out runs/smol/data" in x for x in smol)
    # the search agents: the smol assets, then the format warmup (skipped once built), then the run
    built = (ROOT / "runs" / "warmup" / "smol" / "model" / "config.json").is_file()
    warmup = "common.warmup --config common/configs/warmup_smol.yaml"
    for target, trainer in [
        ("train-eviback", "eviback train --config eviback/configs/smol.yaml"),
        ("train-eviback-baseline", "eviback train --config eviback/configs/smol.yaml teacher."),
        ("train-grpo", "common.search_grpo --config common/configs/grpo_smol.yaml"),
    ]:
        lines = dry_run(target, "SCALE=smol")
        order = [i for i, x in enumerate(lines) if "common.smol.data --out" in x]
        order += [i for i, x in enumerate(lines) if warmup in x] if not built else []
        order.append(lines.index(trainer_line(lines, trainer)))
        assert len(order) == (2 if built else 3) and order == sorted(order), (target, lines)
    assert "run_dir=runs/eviback/smol-baseline" in "".join(
        dry_run("train-eviback-baseline", "SCALE=smol")
    )
    tiny = trainer_line(dry_run("train-grpo"), "common.search_grpo")
    assert tiny.split("--config ")[1].split()[0] == "common/configs/grpo_tiny.yaml"
    # ARCO: the format warmup, then ARCO's own warmup (once), then the co-evolution
    lines = dry_run("train-arco", "SCALE=smol")
    arco_built = (ROOT / "runs" / "arco" / "smol" / "warmup" / "arco.json").is_file()
    order = [i for i, x in enumerate(lines) if warmup in x] if not built else []
    order += [i for i, x in enumerate(lines) if "arco warmup --config arco/configs/smol.yaml" in x]
    order.append(lines.index(trainer_line(lines, "arco train --config arco/configs/smol.yaml")))
    expected = 1 + (not built) + (not arco_built)
    assert len(order) == expected and order == sorted(order), lines
    assert any("arco warmup --config arco/configs/smol.yaml" in x for x in dry_run(
        "warmup-arco", "SCALE=smol"))  # fmt: skip


@pytest.mark.parametrize(
    ("target", "spec"),
    [
        ("compare-grpo", "common/configs/compare_grpo"),
        ("compare-eviback", "eviback/configs/compare"),
    ],
)
def test_the_search_agent_comparisons_at_scale_smol_start_from_smol_s_warmup(target, spec):
    # SMOL_WARM names a folder that is not there, so the warmup shows even where it was built
    lines = dry_run("-B", target, "SCALE=smol", "SMOL_WARM=runs/warmup/smol/absent")
    warmup = [i for i, x in enumerate(lines) if "common/configs/warmup_smol.yaml" in x]
    (run,) = [i for i, x in enumerate(lines) if "experiments.compare" in x]
    assert lines[run].endswith(f"--spec {spec}_smol.yaml") and warmup and warmup[-1] < run
    assert not any("warmup_tiny" in x for x in lines)
    assert dry_run(target)[-1].endswith(f"--spec {spec}_tiny.yaml")


def test_compare_arco_at_scale_smol_starts_from_arco_s_smol_warmup():
    lines = dry_run("-B", "compare-arco", "SCALE=smol", "ARMS=arco")
    warmup = lines.index(trainer_line(lines, "arco warmup --config arco/configs/smol.yaml"))
    (run,) = [i for i, x in enumerate(lines) if "experiments.compare" in x]
    assert warmup < run and lines[run].endswith("--spec arco/configs/compare_smol.yaml --arms arco")
    assert not any("tiny" in x for x in lines)


def test_compare_cer_at_scale_smol_reports_containment_then_exact_match_and_f1():
    lines = dry_run("compare-cer", "SCALE=smol")
    spec = "experiments.compare --spec cer/configs/compare_smol.yaml"
    assert any(x.endswith(spec) for x in lines)
    (reports,) = [x for x in lines if "--report-only" in x]
    assert "--metric correct &&" in reports and reports.endswith("--metric f1")
    assert any(x.endswith("--spec cer/configs/compare_tiny.yaml") for x in dry_run("compare-cer"))


@pytest.mark.parametrize(
    ("scale", "says"), [("tiny", "needs a paper SCALE"), ("smol", "runs for real")]
)
def test_rehearse_refuses_the_scales_that_run_here_in_one_line(scale, says):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    run = subprocess.run(
        ["make", "-n", "rehearse", "METHOD=cer", f"SCALE={scale}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0 and not run.stdout.strip()
    (line,) = run.stderr.strip().splitlines()
    assert says in line, line
    assert ("make train-cer SCALE=smol" in line) == (scale == "smol"), line


def test_make_data_and_data_index_print_their_plan_with_dry_run_1():
    (plan,) = dry_run("data", "METHOD=eviback", "SCALE=1.7b", "DRY_RUN=1")
    assert plan == (
        ".venv/bin/python -m experiments.prepare_data --config eviback/configs/qwen3_1.7b.yaml "
        "--dry-run"
    )
    (fetch,) = dry_run("data", "METHOD=eviback", "SCALE=1.7b", "DRY_RUN=0")
    assert fetch == plan.removesuffix(" --dry-run")
    (index,) = dry_run("data-index", "INDEX=data/sr1", "DRY_RUN=1")
    assert (
        index == ".venv/bin/python -m experiments.prepare_data --search-r1-index data/sr1 --dry-run"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    bad = subprocess.run(["make", "-n", "data", "METHOD=cer", "SCALE=4b", "DRY_RUN=yes"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2
    assert "DRY_RUN=1 prints the plan only; DRY_RUN=0 or unset fetches; not 'yes'" in bad.stderr


def test_ape_eviback_runs_e2e_ape_on_the_config_in_one_process():
    (ape,) = dry_run("ape-eviback", "SCALE=1.7b", "GPUS=8")  # one process, whatever GPUS says
    assert (
        ape.rstrip() == ".venv/bin/python -m eviback ape --config eviback/configs/qwen3_1.7b.yaml"
    )


def test_train_eviback_trains_with_the_ape_policy_when_there_and_says_which(tmp_path):
    """At a paper scale: the policy `make ape-eviback` writes (the config's run_dir/ape/) when
    it is there, passed as teacher.policy_file; else one line saying the hand-written prompts
    train, and the config as it is."""
    default = ROOT / "runs/eviback/qwen3_4b/ape/policy.yaml"
    if default.exists():
        pytest.skip(f"{default} exists here")
    said, train = dry_run("train-eviback", "SCALE=4b")
    assert said == (
        'echo "[make] no E2E-APE policy at runs/eviback/qwen3_4b/ape/policy.yaml (make '
        "ape-eviback SCALE=4b writes it): EviBack's teacher runs the hand-written gated two-stage "
        'prompts"'
    )
    assert "teacher.policy_file" not in train
    policy = tmp_path / "policy.yaml"
    policy.write_text("stage_a: a\n")
    said, train = dry_run("train-eviback", "SCALE=4b", f"APE_POLICY={policy}", "SEED=1")
    assert said == f'echo "[make] EviBack\'s teacher: the E2E-APE policy {policy}"'
    assert train.split()[-2:] == [f"teacher.policy_file={policy}", "seed=1"]
    # the tiny and smol configs' teachers are the oracle: no policy, nothing said
    lines = dry_run("-o", "warmup", "-o", "runs/warmup/tiny/model/config.json", "train-eviback")
    assert not any("E2E-APE" in x or "policy_file" in x for x in lines)


def test_warmup_arco_takes_the_release_s_warmup_file():
    (line,) = dry_run("warmup-arco", "SCALE=qwen3-4b", "WARMUP_FILE=data/hotpotqa/warmup.jsonl")
    assert line.split()[-2:] == [
        "warmup.teacher=file", "warmup.release_file=data/hotpotqa/warmup.jsonl"
    ]  # fmt: skip


def test_wait_services_waits_for_the_config_s_services_up_to_wait_s():
    (line,) = dry_run("wait-services", "METHOD=eviback", "SCALE=1.7b", "WAIT_S=600")
    assert line == (
        ".venv/bin/python -m experiments.wait_services --config eviback/configs/qwen3_1.7b.yaml "
        "--wait-s 600"
    )


def test_serve_retrieval_passes_faiss_gpu_when_given():
    (line,) = dry_run("serve-retrieval", "FAISS_GPU=on")
    assert line.endswith("--port 8000 --faiss-gpu on")
