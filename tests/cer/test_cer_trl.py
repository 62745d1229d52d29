"""cer.trl: CER as a ``trl.GRPOTrainer`` reward, checked against cer's own scorer.

The expected values are computed another way: the prompt ids from ``cer.prompt.prompt_ids``
(not TRL's tokenization), every (solution, answer) pair forwarded from scratch
(``naive_scorer``, not the prefix scorer ``CERReward`` uses), ``cer_from_logprobs`` per group.

Run as a script under two ranks (``deepspeed --num_gpus 2 tests/cer/test_cer_trl.py``, on CPU),
it runs ``two_ranks_main``: the ZeRO-3 check.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from cer.data import MathExample, load_math_examples
from cer.prompt import SYSTEM_PROMPT, prompt_ids, user_message
from cer.rewards.answer import solution_split
from cer.rewards.expectation import cer_from_logprobs
from cer.rewards.groups import is_correct
from cer.rewards.scoring import naive_scorer, score_group
from cer.trl import CERReward, prompt_token_ids

ROOT = Path(__file__).resolve().parents[2]
PROMPT_A = "Add 5 and 7. "
PROMPT_B = "Half of 2? "
# (prompt, reference, completions): 3 completions a group, one without a box
GROUPS = [
    (PROMPT_A, "12", ["5 + 7 = 12, so \\boxed{12}.", "It is \\boxed{1}.", "The total is 7"]),
    (PROMPT_B, "1", ["Half of 2 is 1, hence \\boxed{1}", "\\boxed{12}", "so \\boxed{1/2}."]),
]


def expected_cer(model, tokenizer, prompt: list[int], completions, reference: str) -> list[float]:
    """CER of one group from scratch: every pair forwarded whole, the project's formula."""
    splits = [solution_split(c, tokenizer) for c in completions]
    ref, ans, idx, _ = score_group(naive_scorer(model), prompt, splits, reference, tokenizer)
    return cer_from_logprobs(ref, ans, idx).tolist()


def batch(tokenizer, groups=GROUPS):
    """TRL's reward-call arguments for ``groups``: prompts repeated per completion, ids, answers."""
    prompts, ids, answers = [], [], []
    for prompt, reference, completions in groups:
        for c in completions:
            prompts.append(prompt)
            ids.append(tokenizer(c, add_special_tokens=False)["input_ids"] + [2])
            answers.append(reference)
    return prompts, ids, answers


def test_rewards_equal_cers_own_scorer_group_by_group(tiny_qwen3, char_tokenizer):
    prompts, ids, answers = batch(char_tokenizer)
    metrics: dict[str, list[float]] = {}
    grads = [p.requires_grad for p in tiny_qwen3.parameters()]
    training = tiny_qwen3.training
    reward = CERReward(char_tokenizer, "cer", scorer_model=tiny_qwen3, num_generations=3)
    got = reward(
        prompts, None, ids, answer=answers, log_metric=lambda k, v: metrics.setdefault(k, [v])
    )
    # the scorer stays as given (the fixture is the session's: later tests train copies of it)
    assert [p.requires_grad for p in tiny_qwen3.parameters()] == grads
    assert tiny_qwen3.training == training
    want = []
    for g, (prompt, reference, _) in enumerate(GROUPS):
        p = char_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        want += expected_cer(tiny_qwen3, char_tokenizer, p, ids[3 * g : 3 * g + 3], reference)
    assert len(got) == 6
    assert got == pytest.approx(want, abs=1e-5)
    assert got[2] == 0.0  # no box: no answer
    assert min(got[:2] + got[3:]) > 0.0
    assert metrics["cer/distinct_answers"] == [2.5]  # answers (12, 1) and (1, 12, 1/2)
    # one call for both groups; the same values with one group per call
    assert reward.calls == 1
    per_group = CERReward(
        char_tokenizer, "cer", scorer_model=tiny_qwen3, num_generations=3, groups_per_call=1
    )
    assert per_group(prompts, None, ids, answer=answers) == pytest.approx(got, abs=1e-6)
    assert per_group.calls == 2


def test_rule_cer_exact_and_rule_types(tiny_qwen3, char_tokenizer):
    prompts, ids, answers = batch(char_tokenizer)
    cer = CERReward(char_tokenizer, "cer", scorer_model=tiny_qwen3, num_generations=3)
    cer_values = cer(prompts, None, ids, answer=answers)
    boxed = [solution_split(i, char_tokenizer).answer for i in ids]
    rule = [float(a is not None and is_correct(a, MathExample("x", "", r))) for a, r in
            zip(boxed, answers, strict=True)]  # fmt: skip
    assert rule == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    exact = [float(a == r) for a, r in zip(boxed, answers, strict=True)]
    for kind, want in (
        ("rule+cer", [1.0 if r else c for r, c in zip(rule, cer_values, strict=True)]),
        ("rule", rule),
        ("exact", exact),
    ):
        reward = CERReward(char_tokenizer, kind, scorer_model=tiny_qwen3, num_generations=3)
        assert reward(prompts, None, ids, answer=answers) == pytest.approx(want, abs=1e-6), kind
        assert reward.__name__ == kind
    # the verifiers need no model, no group size
    assert CERReward(char_tokenizer, "rule")(prompts, None, ids, answer=answers) == rule


def test_prompt_ids_without_a_trainer_are_the_tokenizers(char_tokenizer):
    ids = prompt_token_ids(char_tokenizer, [PROMPT_A, PROMPT_B])
    assert ids == [
        char_tokenizer(p, add_special_tokens=False)["input_ids"] for p in (PROMPT_A, PROMPT_B)
    ]


def test_bad_inputs_are_clear_errors(tiny_qwen3, char_tokenizer):
    prompts, ids, answers = batch(char_tokenizer)
    frozen = CERReward(char_tokenizer, "cer", scorer_model=tiny_qwen3, num_generations=3)
    with pytest.raises(RuntimeError, match=r"not attached: call reward.attach\(trainer\)"):
        CERReward(char_tokenizer, "cer", num_generations=3)(prompts, None, ids, answer=answers)
    with pytest.raises(RuntimeError, match="no group size"):
        CERReward(char_tokenizer, "cer", scorer_model=tiny_qwen3)(
            prompts, None, ids, answer=answers
        )
    with pytest.raises(ValueError, match="has 5 completions, not a multiple of the group size 3"):
        frozen(prompts[:5], None, ids[:5], answer=answers[:5])
    with pytest.raises(ValueError, match="group 1 of this call do not share one prompt"):
        frozen(prompts[:3] + [PROMPT_B, PROMPT_A, PROMPT_B], None, ids, answer=answers)
    with pytest.raises(ValueError, match=r"no 'answer' column .* \['solution'\]"):
        frozen(prompts, None, ids, solution=answers)
    with pytest.raises(ValueError, match="no completion_ids"):
        frozen(prompts, ["x"] * 6, answer=answers)
    with pytest.raises(ValueError, match="reward_type must be one of"):
        CERReward(char_tokenizer, "cer+rule")
    with pytest.raises(ValueError, match="num_generations must be at least 1"):
        CERReward(char_tokenizer, num_generations=0)
    with pytest.raises(TypeError, match="expects a trl.GRPOTrainer"):
        frozen.attach(object())


# --- two ZeRO-3 ranks (CPU): shares that cut a group, unequal scorer-call counts -------------


def two_ranks_main() -> None:
    """Under the DeepSpeed launcher, 2 ranks scoring with a ZeRO-3 partitioned model (each
    forward gathers its parameters from both ranks): the 4 groups of 2 split 3 / 5 (a group cut
    between the ranks) and 2 / 6, one group per scorer call. Each rank checks its rewards against
    an unpartitioned copy scoring the whole batch and prints its scorer-call count (equal on
    both: padded to the max; unequal forward counts would hang the gathers)."""
    from conftest import build_char_tokenizer  # tests/cer/conftest.py (the script's folder)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from common.train import TrainConfig, TrainEngine

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    full = copy.deepcopy(model).eval()
    train = TrainEngine(model, TrainConfig(zero_stage=3, total_steps=1))
    assert any(hasattr(p, "ds_id") for p in train.model.parameters()), "not partitioned"
    groups = [(p, r, c[:2]) for p, r, c in GROUPS] + [(p, r, c[1:]) for p, r, c in GROUPS]
    prompts, ids, answers = batch(tokenizer, groups)
    whole = CERReward(tokenizer, "cer", scorer_model=full, num_generations=2, sync_ranks=False)
    want = whole(prompts, None, ids, answer=answers)
    assert sum(v > 0.0 for v in want) == 7  # all but the one without a box
    for cut in (3, 2):
        share = slice(0, cut) if train.rank == 0 else slice(cut, len(ids))
        reward = CERReward(
            tokenizer, "cer", scorer_model=train.model, num_generations=2, groups_per_call=1
        )
        got = reward(prompts[share], None, ids[share], answer=answers[share])
        assert got == pytest.approx(want[share], abs=1e-5), (train.rank, cut, got, want[share])
        print(f"rank {train.rank} cut {cut}: ok, {reward.calls} scorer calls", flush=True)


@pytest.mark.slow
def test_two_zero3_ranks_score_whole_groups_in_lockstep(launch_two_ranks):
    run = launch_two_ranks([str(Path(__file__))], timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # (the ranks share one stdout: a line may follow another rank's output on the same line)
    found = sorted(re.findall(r"rank (\d) cut (\d): ok, (\d+) scorer calls", run.stdout))
    # cut 3: rank 0 scores groups 0-1 (2 calls), rank 1 groups 1-3 (3 calls): both make 3;
    # cut 2: rank 0 group 0 (1 call, padded to 3), rank 1 groups 1-3 (3)
    assert found == [("0", "2", "3"), ("0", "3", "3"), ("1", "2", "3"), ("1", "3", "3")], run.stdout


# --- two TRL GRPO steps on the tiny CER task ----------------------------------------------------


@pytest.fixture(scope="module")
def warm_task(tmp_path_factory) -> Path:
    """The tiny alias task, small, and a brief warmup (it boxes answers)."""
    from cer.config import CERConfig
    from cer.tasks.build import build_tiny
    from cer.warmup import run_warmup
    from common.config import load_config

    root = tmp_path_factory.mktemp("cer_trl")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait on each other across threads
    try:
        task = build_tiny(root / "task", seed=0, n_train=30, n_dev=4, n_test=4)
        cfg = load_config(
            CERConfig,
            str(ROOT / "cer" / "configs" / "tiny.yaml"),
            [f"assets.init_model={task / 'model'}", f"assets.warmup={task / 'warmup.jsonl'}",
             f"warmup.out={root / 'warmup'}", "warmup.steps=40", "warmup.batch_size=8"],
        )  # fmt: skip
        run_warmup(cfg)
        yield task
    finally:
        torch.set_num_threads(threads)


def dataset_rows(examples: list[MathExample]) -> list[dict]:
    """TRL dataset rows: the CER chat prompt as messages, the reference, the example's fields."""
    return [
        {
            "prompt": [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": user_message(ex)}],
            "answer": ex.answer, "id": ex.id, **ex.metadata,
        }
        for ex in examples
    ]  # fmt: skip


@pytest.mark.slow
def test_two_trl_grpo_steps_get_cers_rewards(warm_task, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    model_dir = warm_task.parent / "warmup" / "model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    frozen = copy.deepcopy(model)
    examples = load_math_examples(warm_task / "train.jsonl").examples[:16]
    rows = dataset_rows(examples)
    by_id = {ex.id: ex for ex in examples}
    live = CERReward(reward_type="cer")
    # not attached: its own group size, the prompt ids from the tokenizer's chat template
    still = CERReward(
        tokenizer, "rule+cer", scorer_model=frozen, num_generations=4, name="frozen_rule_cer"
    )
    calls: list[dict] = []

    def checked(reward, scorer, **kw):
        """The reward as TRL calls it, and the expected values on the same groups."""

        def fn(prompts, completions, completion_ids, **kwargs):
            got = reward(prompts, completions, completion_ids, **kwargs)
            g = trainer.num_generations
            want, initial = [], []
            model_now = scorer()
            for k in range(0, len(got), g):
                ex = by_id[kwargs["id"][k]]
                ids = [list(c) for c in completion_ids[k : k + g]]
                prompt = prompt_ids(tokenizer, ex)
                initial += expected_cer(frozen, tokenizer, prompt, ids, ex.answer)
                cer = expected_cer(model_now, tokenizer, prompt, ids, ex.answer)
                if reward.reward_type == "rule+cer":
                    rule = [is_correct(solution_split(c, tokenizer).answer, ex) for c in ids]
                    cer = [1.0 if r else c for r, c in zip(rule, cer, strict=True)]
                want += cer
            calls.append({"name": reward.__name__, "step": kwargs["trainer_state"].global_step,
                          "got": got, "want": want, "initial": initial})  # fmt: skip
            return got

        fn.__name__ = reward.__name__
        return fn

    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, num_generations=4,
        max_completion_length=48, max_steps=2, learning_rate=1e-3, bf16=False, use_cpu=True,
        # 0.3: the brief warmup boxes an answer in about 40% of its samples (1.0: 6%)
        report_to="none", logging_steps=1, save_strategy="no", seed=0, temperature=0.3,
        reward_weights=[1.0, 0.0], disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[
            checked(live, lambda: trainer.model),
            checked(still, lambda: frozen),
        ],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    live.attach(trainer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    assert trainer.state.global_step == 2
    assert [(c["name"], c["step"]) for c in calls] == [
        ("cer", 0), ("frozen_rule_cer", 0), ("cer", 1), ("frozen_rule_cer", 1),
    ]  # fmt: skip
    for c in calls:
        assert len(c["got"]) == 16  # 4 prompts x 4 completions, whole groups in one call
        assert c["got"] == pytest.approx(c["want"], abs=1e-5), c["name"]
        assert c["got"] == pytest.approx(c["want"], rel=1e-3), c["name"]  # small ones too
    # the live reward scored step 1 with the weights step 0's update made, not the initial ones
    live_calls = [c for c in calls if c["name"] == "cer"]
    assert live_calls[0]["got"] == pytest.approx(live_calls[0]["initial"], rel=1e-3, abs=1e-9)
    assert live_calls[1]["got"] != pytest.approx(live_calls[1]["initial"], rel=1e-3, abs=1e-9)
    # the rewards are not trivially 0: the warmup boxes answers, CER grades them
    assert sum(v > 0 for c in calls for v in c["got"]) >= 4
    # TRL logged what the reward returned
    logged = [h for h in trainer.state.log_history if "rewards/cer/mean" in h]
    assert len(logged) == 2
    for h, c in zip(logged, [c for c in calls if c["name"] == "cer"], strict=True):
        assert h["rewards/cer/mean"] == pytest.approx(sum(c["got"]) / 16, abs=1e-6)
        assert math.isfinite(h["cer/ref_prob_mean"])
    # the live policy moved after step 1; the frozen scorer stayed the initial weights
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(before[k], frozen.state_dict()[k]) for k in before)
    # TRL generated from the ids cer.prompt builds (its chat template, the generation prompt)
    ex = examples[0]
    assert live.prompt_ids([rows[0]["prompt"]]) == [prompt_ids(tokenizer, ex)]
    json.dumps(calls)  # plain data


def trl_two_ranks_main(model_dir: str, train_file: str, out_dir: str) -> None:
    """Under torchrun, 2 CPU processes (accelerate: gloo, DDP), two TRL GRPO steps of 3 prompts x 4
    completions, 6 a process: the middle group is cut between the processes. Each process checks
    its live CER rewards against the whole groups (gathered here) scored from scratch."""
    import torch.distributed as dist
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples = load_math_examples(train_file).examples[:12]
    by_id = {ex.id: ex for ex in examples}
    reward = CERReward(reward_type="cer")

    def cer(prompts, completions, completion_ids, **kwargs):
        got = reward(prompts, completions, completion_ids, **kwargs)
        rank, world = dist.get_rank(), dist.get_world_size()
        shares: list = [None] * world
        dist.all_gather_object(shares, (kwargs["id"], [list(c) for c in completion_ids]))
        ids = [i for share, _ in shares for i in share]
        comps = [c for _, share in shares for c in share]
        scorer = trainer.accelerator.unwrap_model(trainer.model)
        want = []
        for k in range(0, len(comps), 4):
            ex = by_id[ids[k]]
            assert set(ids[k : k + 4]) == {ex.id}
            want += expected_cer(scorer, tokenizer, prompt_ids(tokenizer, ex), comps[k:k + 4],
                                 ex.answer)  # fmt: skip
        mine = want[rank * len(got) : (rank + 1) * len(got)]
        assert got == pytest.approx(mine, abs=1e-5) and got == pytest.approx(mine, rel=1e-3)
        step = kwargs["trainer_state"].global_step
        print(f"rank {rank} step {step}: {len(got)} rewards ok, {sum(v > 0 for v in got)} > 0")
        sys.stdout.flush()
        return got

    args = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=6, num_generations=4,
        max_completion_length=48, max_steps=2, learning_rate=1e-3, bf16=False, use_cpu=True,
        report_to="none", logging_steps=1, save_strategy="no", seed=0, temperature=0.3,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=[cer], args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_list(dataset_rows(examples)))  # fmt: skip
    reward.attach(trainer)
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.slow
def test_two_trl_processes_score_the_group_cut_between_them(warm_task, tmp_path, launch_two_ranks):
    model_dir = warm_task.parent / "warmup" / "model"
    run = launch_two_ranks(
        [str(Path(__file__)), "--trl", str(model_dir), str(warm_task / "train.jsonl"),
         str(tmp_path / "out")],
        torchrun=True, timeout=500,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    found = re.findall(r"rank (\d) step (\d): 6 rewards ok, (\d) > 0", run.stdout)
    assert sorted(f[:2] for f in found) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert sum(int(f[2]) for f in found) >= 4, run.stdout  # not all 0: CER grades answers


if __name__ == "__main__":  # the two-rank tests launch this file
    from common.train.distributed import exit_process

    if "--trl" in sys.argv:  # test_two_trl_processes_score_the_group_cut_between_them
        trl_two_ranks_main(*sys.argv[sys.argv.index("--trl") + 1 :][:3])
    else:  # test_two_zero3_ranks_score_whole_groups_in_lockstep (--local_rank=N follows)
        two_ranks_main()
    exit_process(0)
