"""The tiny CER pipeline end to end, small: build, warmup, 2 RL steps, eval, and the errors."""

from __future__ import annotations

import copy
import json
import math
import random
import re
from pathlib import Path

import pytest
import torch

from cer.cli import main
from cer.config import CERConfig, MissingAssetError, check_assets
from cer.evaluate import results_table, run_eval
from cer.rewards.scoring import hf_prefix_scorer
from cer.tasks.build import build_tiny, tokenizer_texts
from cer.trainer import ALL_TYPES, make_score_fn, train_cer
from cer.warmup import run_warmup
from common.config import load_config

TINY = "cer/configs/tiny.yaml"
ROOT = Path(__file__).resolve().parents[2]


def tiny_config(root: Path, *overrides: str) -> CERConfig:
    task = root / "task"
    return load_config(
        CERConfig,
        TINY,
        [
            f"assets.init_model={task / 'model'}",
            f"assets.warmup={task / 'warmup.jsonl'}",
            f"assets.train={task / 'train.jsonl'}",
            f"assets.dev={task / 'dev.jsonl'}",
            f"assets.eval.tiny_test={task / 'test.jsonl'}",
            f"assets.model={root / 'warmup' / 'model'}",
            f"warmup.out={root / 'warmup'}",
            "warmup.steps=20",
            "warmup.batch_size=8",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cer_tiny")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait on each other across threads
    try:
        build_tiny(root / "task", seed=0, n_train=120, n_dev=6, n_test=6)
        run_warmup(tiny_config(root))
        yield root
    finally:
        torch.set_num_threads(threads)


def test_build_tiny_tokenizer_is_deterministic_and_keeps_the_brace_alone(tiny_root):
    from common.tinyworld.tokenizer import build_tokenizer

    texts = tokenizer_texts(tiny_root / "task")
    assert build_tokenizer(texts, 512).backend_tokenizer.to_str() == (
        build_tokenizer(texts, 512).backend_tokenizer.to_str()
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_root / "task" / "model")
    pieces = tok.convert_ids_to_tokens(tok.encode("is \\boxed{12}.", add_special_tokens=False))
    assert pieces[-2:] == ["}", "."]
    assert tok.convert_ids_to_tokens(tok.encode(" in", add_special_tokens=False)) == ["Ġin"]


def test_build_tiny_is_byte_identical_per_seed_and_keeps_the_arithmetic_task(tmp_path):
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    a = build_tiny(tmp_path / "a", seed=1, n_train=30, n_dev=4, n_test=4)
    b = build_tiny(tmp_path / "b", seed=1, n_train=30, n_dev=4, n_test=4)
    assert files(a) == files(b) and "model/model.safetensors" in files(a)
    meta = json.loads((a / "meta.json").read_text())
    assert meta["task"] == "alias" and meta["worlds"] == "shared-names"
    assert "documents.jsonl" in files(a)  # the shared world's documents: the tokenizer's corpus
    from transformers import AutoTokenizer

    assert len(AutoTokenizer.from_pretrained(a / "model")) == 2048
    fresh = build_tiny(tmp_path / "f", seed=1, n_train=30, n_dev=4, n_test=4, worlds="fresh")
    assert "documents.jsonl" not in files(fresh)
    assert len(AutoTokenizer.from_pretrained(fresh / "model")) == 512
    with pytest.raises(ValueError, match="option of the alias task only"):
        build_tiny(tmp_path / "g", task="arithmetic", worlds="shared")
    arith = build_tiny(tmp_path / "c", seed=1, n_train=30, n_dev=4, n_test=4, task="arithmetic")
    assert "task" not in json.loads((arith / "meta.json").read_text())
    assert (arith / "model" / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="unknown tiny task 'chess'"):
        build_tiny(tmp_path / "d", task="chess")


def test_build_tiny_isolate_spaces_gives_a_name_the_same_ids_in_the_context_and_the_box(tmp_path):
    from transformers import AutoTokenizer

    root = build_tiny(tmp_path / "iso", seed=1, n_train=30, n_dev=4, n_test=4, isolate_spaces=True)
    tok = AutoTokenizer.from_pretrained(root / "model")
    assert tok.convert_ids_to_tokens(tok.encode(" in", add_special_tokens=False)) == ["Ġ", "in"]
    name = tok.encode("Shusti", add_special_tokens=False)
    boxed = tok.encode("\\boxed{Shusti}", add_special_tokens=False)
    assert tok.encode(" Shusti", add_special_tokens=False)[1:] == name == boxed[-1 - len(name) : -1]
    assert (
        main(
            [
                "build-tiny",
                "--out",
                str(tmp_path / "cli"),
                "--n-train",
                "30",
                "--n-dev",
                "4",
                "--n-test",
                "4",
                "--seed",
                "1",
                "--isolate-spaces",
            ]
        )
        == 0
    )
    assert (tmp_path / "cli" / "model" / "tokenizer.json").read_bytes() == (
        root / "model" / "tokenizer.json"
    ).read_bytes()


def test_train_records_reward_accuracy_and_every_reward_type(tiny_root, monkeypatch):
    import cer.trainer

    run_dir = tiny_root / "run"
    # every call of the step's scorer: the reward's pass, which samples/ reuses (no own pass)
    scored: list[int] = []

    def counted(*args, **kwargs):
        score_fn = make_score_fn(*args, **kwargs)

        def score(prefixes, *rest):
            scored.append(len(prefixes))
            return score_fn(prefixes, *rest)

        return score

    monkeypatch.setattr(cer.trainer, "make_score_fn", counted)
    cfg = tiny_config(
        tiny_root,
        f"run_dir={run_dir}",
        "steps=2",
        "prompts_per_step=2",
        "group_size=4",
        "loss.micro_batch_size=4",
        "eval_every=2",
        "eval_questions=4",
        "max_response_tokens=32",
    )
    torch.set_num_threads(1)
    out = train_cer(cfg)
    assert [e["step"] for e in out["evals"]] == [0, 2]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # one scoring call a step (the reward's, every rollout's pairs), which samples/ (a group a
    # step) reuses: nothing scored for samples/ alone
    assert len(scored) == 2 and all(n > 0 for n in scored)
    assert [r["tokens/reward_samples"] for r in steps] == [0, 0]
    # per-problem dev results (experiments.compare's input), in dev order, as logged
    dev_ids = [json.loads(line)["id"] for line in (tiny_root / "task" / "dev.jsonl").open()][:4]
    for logged in (r for r in records if "dev/accuracy" in r):
        path = run_dir / "dev_results" / f"step_{logged['step']:05d}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["id"].split(":")[-1] for r in rows] == dev_ids
        assert {"correct", "exact", "boxed", "valid"} <= set(rows[0])
        for field, key in (("correct", "accuracy"), ("exact", "exact_accuracy")):
            assert sum(r[field] for r in rows) / 4 == pytest.approx(logged[f"dev/{key}"])
        assert logged["dev/correct"] == logged["dev/accuracy"]
    assert sorted(p.name for p in (run_dir / "dev_results").iterdir()) == [
        "step_00000.jsonl",
        "step_00002.jsonl",
    ]
    for r in steps:
        assert r["reward"] == r["reward/cer"] and r["accuracy"] == r["reward/rule"]
        assert 0 <= r["reward"] <= 1 and 0 <= r["cer/distinct_answers"] <= 4
        assert all(f"samples/reward/{t}" in r for t in ALL_TYPES)
        # reward.signal (default): every type on every group, all 2 x 4 solutions scored
        assert all(f"reward/{t}" in r and f"signal/abs_adv/{t}" in r for t in ALL_TYPES)
        assert r["signal/ref_prob_right_n"] + r["signal/ref_prob_wrong_n"] == 8
        assert 0 <= r["signal/mixed_pairs"] <= 2 * 2 * 2  # at most 2 x 2 pairs a group of 4
        assert ("signal/auc/cer" in r) == (r["signal/mixed_pairs"] > 0)
    sample = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert set(sample["cer_summary"]) == {
        "cer/ref_prob_mean",
        "cer/ref_prob_max",
        "cer/distinct_answers",
    }
    (group,) = sample["groups"]
    assert len(group["samples"]) == 4
    for s in group["samples"]:
        rewards = s["rewards"]
        assert set(rewards) == set(ALL_TYPES)
        assert rewards["rule+cer"] == (1.0 if rewards["rule"] else rewards["cer"])
        if s["answer"] is None:
            assert rewards["cer"] == 0 and rewards["rule"] == 0
    assert (run_dir / "checkpoints" / "step_2" / "model.safetensors").is_file()
    assert (run_dir / "dev_curve.png").stat().st_size > 0
    # batches.jsonl: each step's prompts (2 of the seed's shuffle a step) and its 2 x 4 samples
    from transformers import AutoTokenizer

    from cer.evaluate import load_problems

    tok = AutoTokenizer.from_pretrained(cfg.assets.model)
    a = cfg.assets
    problems = load_problems(a.train, tok, cfg.max_prompt_tokens, a.train_format, a.train_filter)
    train_ids = [ex.id for ex in problems[0]]
    order = list(range(len(train_ids)))
    random.Random(cfg.seed).shuffle(order)
    assert [json.loads(x) for x in (run_dir / "batches.jsonl").open()] == [
        {"step": s, "ids": [train_ids[order[2 * s - 2]], train_ids[order[2 * s - 1]]],
         "trajectories": 8}
        for s in (1, 2)
    ]  # fmt: skip
    # eval picks up the run's latest checkpoint and writes JSON + markdown
    cfg.eval.k, cfg.eval.max_tokens = 2, 24
    # a benchmark of its own sample count (the paper configs: one sample on multiple choice)
    cfg.assets.eval["tiny_one"] = cfg.assets.eval["tiny_test"]
    cfg.eval.k_by_benchmark = {"tiny_one": 1}
    results = run_eval(cfg)
    assert "avg@1" in results["tiny_one"] and "avg@2" not in results["tiny_one"]
    saved = json.loads((run_dir / "eval" / "results.json").read_text())
    assert saved["model"].endswith("step_2") and saved["results"] == results
    tiny = results["tiny_test"]
    assert tiny["problems"] == 6 and 0 <= tiny["avg@2"] <= tiny["pass@2"] <= 1
    assert 0 <= tiny["exact_avg@2"] <= 1
    per = json.loads((run_dir / "eval" / "tiny_test.json").read_text())
    assert per["verifier"] == "alias"
    assert len(per["sampled_rows"]) == 6 and all(
        len(r["answers"]) == 2 for r in per["sampled_rows"]
    )
    assert sum(sum(r["correct"]) for r in per["sampled_rows"]) / 12 == tiny["avg@2"]
    assert "| tiny_test |" in (run_dir / "eval" / "results.md").read_text()


@pytest.mark.slow
def test_two_ranks_train_one_ranks_batches_with_identical_weights(
    tiny_root, tmp_path, launch_two_ranks
):
    """`cer train` on two DeepSpeed CPU ranks (ZeRO-2): prompts_per_step is global, so each
    step's prompts over both ranks, in rank order, are the ones one rank draws for that step,
    with one rank's trajectories per update; the ranks' weights agree before the first step and
    after each. The same launch scores uneven groups on a ZeRO-3 model (each forward gathers the
    parameters across ranks: ranks scoring different numbers of groups still make the same number
    of forwards)."""
    from transformers import AutoTokenizer

    from cer.evaluate import load_problems
    from common.batches import step_batch

    run_dir = tmp_path / "run"
    task = tiny_root / "task"
    over = [
        f"assets.model={tiny_root / 'warmup' / 'model'}",
        f"assets.train={task / 'train.jsonl'}",
        f"assets.dev={task / 'dev.jsonl'}",
        f"run_dir={run_dir}",
        "steps=2",
        "prompts_per_step=4",
        "group_size=2",
        "loss.micro_batch_size=2",
        "eval_every=2",
        "eval_questions=4",
        "max_response_tokens=16",
    ]
    script = ROOT / "tests" / "scripts" / "cer_two_ranks.py"
    run = launch_two_ranks([str(script), "--config", TINY, *over])
    output = run.stdout[-15000:] + run.stderr[-15000:]
    assert run.returncode == 0, output
    for rank, pairs in ((0, 36), (1, 12)):
        assert f"rank {rank}: scoring ok ({pairs} pairs)" in output, output
    weights = {}
    for rank, step, sha in re.findall(r"rank (\d) step (\d) weights ([0-9a-f]{16})", output):
        weights.setdefault(int(step), {})[int(rank)] = sha
    assert sorted(weights) == [0, 1, 2] and all(len(w) == 2 for w in weights.values()), output
    assert all(w[0] == w[1] for w in weights.values()), weights
    assert weights[2][0] != weights[0][0]  # the updates moved the weights
    # one rank's draw of each step with the same config: the seed's shuffle, 4 prompts a step
    cfg = tiny_config(tiny_root, *over)
    tok = AutoTokenizer.from_pretrained(cfg.assets.model)
    a = cfg.assets
    problems = load_problems(a.train, tok, cfg.max_prompt_tokens, a.train_format, a.train_filter)
    train_ids = [ex.id for ex in problems[0]]
    order = list(range(len(train_ids)))
    random.Random(cfg.seed).shuffle(order)
    one_rank = [
        {"step": s, "ids": [train_ids[i] for i in step_batch(s, order, 4)], "trajectories": 8}
        for s in (1, 2)
    ]
    assert [json.loads(x) for x in (run_dir / "batches.jsonl").open()] == one_rank
    # each rank sampled its own half: the groups in step 1's samples are rank 0's first prompt
    sample = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert [g["id"] for g in sample["groups"]] == one_rank[0]["ids"][:1]
    # the dev shards gathered back into dev order
    dev_ids = [json.loads(line)["id"] for line in (task / "dev.jsonl").open()][:4]
    for step in (0, 2):
        path = run_dir / "dev_results" / f"step_{step:05d}.jsonl"
        assert [json.loads(x)["id"].split(":")[-1] for x in path.open()] == dev_ids


def test_warmup_context_weight_changes_the_update(tiny_root, tmp_path):
    def one_step(weight: float) -> dict[str, torch.Tensor]:
        from transformers import AutoModelForCausalLM

        out = tmp_path / f"w{weight}"
        cfg = tiny_config(
            tiny_root,
            f"warmup.out={out}",
            "warmup.steps=1",
            "warmup.train.warmup_steps=0",
            f"warmup.context_weight={weight}",
        )
        model = AutoModelForCausalLM.from_pretrained(run_warmup(cfg), dtype=torch.float32)
        assert load_config(CERConfig, out / "config.yaml").warmup.context_weight == weight
        return model.state_dict()

    torch.set_num_threads(1)
    solution_only, with_context = one_step(0.0), one_step(1.0)
    assert any(not torch.equal(v, with_context[k]) for k, v in solution_only.items())


def test_verifree_with_its_likelihood_term_runs_end_to_end(tiny_root):
    # (the 20-step warmup rarely boxes an answer: what the term trains is checked on
    # hand-made groups in test_cer_verifree.py; here the trainer's path through it)
    run_dir = tiny_root / "run_verifree"
    cfg = tiny_config(
        tiny_root,
        f"run_dir={run_dir}",
        "steps=1",
        "prompts_per_step=2",
        "group_size=4",
        "loss.micro_batch_size=4",
        "eval_every=0",
        "max_response_tokens=24",
        "reward.type=verifree",
    )
    assert cfg.reward.verifree_likelihood  # the published method is the default
    torch.set_num_threads(1)
    train_cer(cfg)
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 0 <= record["reward/verifree"] <= 1 and "grad_norm" in record
    assert (run_dir / "checkpoints" / "step_1" / "model.safetensors").is_file()


def test_samples_per_step_0_trains_and_writes_no_group(tiny_root):
    """``samples_per_step=0`` (allowed: ge 0) writes an empty samples record; it crashed in
    ``torch.cat`` of no group's rewards."""
    run_dir = tiny_root / "run_no_samples"
    cfg = tiny_config(
        tiny_root,
        f"run_dir={run_dir}",
        "steps=1",
        "prompts_per_step=2",
        "group_size=2",
        "loss.micro_batch_size=4",
        "eval_every=0",
        "max_response_tokens=16",
        "samples_per_step=0",
        "reward.signal=false",
    )
    torch.set_num_threads(1)
    train_cer(cfg)
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert not any(k.startswith("samples/") for k in record)
    # what TRL and verl users look for, from the update (tests/test_update_metrics.py by hand)
    assert record["lr"] > 0 and record["clip_frac"] == 0.0
    # over the rows the update forwarded: none where every advantage was 0 (then NaN)
    assert record["entropy"] > 0 if record["update_rows"] else math.isnan(record["entropy"])
    assert 0 < record["response_length/mean"] <= record["response_length/max"] <= 16
    sample = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert sample == {"cer_summary": {}, "groups": []}


def test_frozen_scorer_keeps_the_initial_policy_and_grpo_advantages(tiny_root):
    from transformers import AutoModelForCausalLM

    run_dir = tiny_root / "run_frozen"
    cfg = tiny_config(
        tiny_root,
        f"run_dir={run_dir}",
        "steps=1",
        "prompts_per_step=2",
        "group_size=4",
        "loss.micro_batch_size=4",
        "eval_questions=2",
        "max_response_tokens=24",
        "reward.frozen_scorer=true",
        "reward.advantage=grpo",
    )
    torch.set_num_threads(1)
    train_cer(cfg)
    # GRPO advantages: (r - mean) / (std + eps) within the group, from the training reward
    (group,) = json.loads((run_dir / "samples" / "step_00001.json").read_text())["groups"]
    r = torch.tensor([s["rewards"]["cer"] for s in group["samples"]])
    expected = (r - r.mean()) / (r.std() + 1e-6)
    got = torch.tensor([s["advantage"] for s in group["samples"]])
    assert torch.allclose(got, expected, atol=1e-5)
    # The frozen scorer keeps scoring with the initial policy while the policy moves.
    initial = AutoModelForCausalLM.from_pretrained(cfg.assets.model, dtype=torch.float32)
    trained = copy.deepcopy(initial)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.05 * torch.randn_like(p))
    frozen = make_score_fn(cfg.reward, None, trained, copy.deepcopy(initial).eval())
    live = make_score_fn(cfg.reward, None, trained, None)
    reference = hf_prefix_scorer(initial)
    prefixes, conts = [[5, 6, 7, 8]] * 2, [[9, 10], [11]]

    def flat(score):
        return [x for row in score(prefixes, conts) for x in row]

    assert flat(frozen) == pytest.approx(flat(reference), abs=1e-6)
    assert flat(live) != pytest.approx(flat(reference), abs=1e-3)


def test_results_table():
    table = results_table({"a": {"avg@2": 0.25, "problems": 4}}, "m")
    assert table.splitlines()[2:] == [
        "| benchmark | avg@2 | problems |",
        "|---|---|---|",
        "| a | 0.250 | 4 |",
    ]


def test_missing_assets_are_named_with_how_to_get(tmp_path):
    cfg = load_config(
        CERConfig,
        "cer/configs/qwen3_4b_base_math.yaml",
        [f"assets.model={tmp_path / 'nope'}", f"assets.train={tmp_path / 'math.jsonl'}"],
    )
    with pytest.raises(MissingAssetError) as err:
        check_assets(cfg.assets, ["model", "train", "eval"])
    text = str(err.value)
    assert f"assets.model = '{tmp_path / 'nope'}'" in text
    assert f"assets.train = '{tmp_path / 'math.jsonl'}'" in text
    assert "assets.eval.aime24" in text and "hf download" in text


def test_cli_reports_a_missing_model_before_loading(tmp_path, capsys):
    code = main(["train", "--config", TINY, f"assets.model={tmp_path / 'm'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "assets.model" in err and "python -m cer build-tiny" in err


def test_compare_spec_runs_the_four_rewards_against_exact():
    from experiments.compare import load_spec

    spec = load_spec("cer/configs/compare_tiny.yaml")
    assert [a["name"] for a in spec["arms"]] == ["exact", "rule", "cer", "rule+cer"]
    for arm in spec["arms"]:
        assert arm["overrides"] == [f"reward.type={arm['name']}"]
        assert arm["command"][-2:] == ["--config", TINY]
    assert (spec["seeds"], spec["metric"], spec["baseline"]) == ([0, 1, 2], "correct", "exact")


RUN_CONFIGS = sorted(p for p in Path("cer/configs").glob("*.yaml") if "compare" not in p.name)


@pytest.mark.parametrize("config", RUN_CONFIGS)
def test_every_config_loads(config):
    cfg = load_config(CERConfig, config)
    if "qwen3" in config.name:
        assert (cfg.prompts_per_step, cfg.group_size, cfg.train.lr) == (32, 16, 1e-6)
        assert (cfg.max_prompt_tokens, cfg.max_response_tokens, cfg.eval.max_tokens) == (
            2048,
            4096,
            8192,
        )
        assert cfg.assets.model == (
            "Qwen/Qwen3-4B-Base" if "4b" in config.name else "Qwen/Qwen3-8B-Base"
        )
    assert cfg.loss.aggregation == "seq_mean_token_sum" and cfg.reward.advantage == "rloo"
