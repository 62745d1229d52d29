"""`cer warmup`: supervised warmup on the tiny task's worked solutions, so that the tiny model
writes reasoning and a boxed answer before RL (the paper starts from a base model instead).

Each example is the CER prompt followed by ``solution + end-of-turn``; the loss is the token-mean
NLL of the solution tokens plus ``warmup.context_weight`` times the token-mean NLL of the prompt
tokens (common.warmup's SFT loop and ``sft_loss``; padding is in neither). The prompt term is
language modelling on the question and its context: an alias-task context repeats its names and
numbers, which teaches the copying the answer needs. The logged ``sft_loss`` is the solution NLL.
"""

from __future__ import annotations

from pathlib import Path

from cer.config import CERConfig, check_assets
from cer.data import load_math_examples
from cer.prompt import prompt_ids
from cer.rollout import END_OF_TURN
from common.rollout.agent import encode_text
from common.rollout.trajectory import Trajectory
from common.train.distributed import current_rank
from common.warmup import SFTRun, sft_and_save


def solution_trajectories(path: str, tokenizer) -> list[Trajectory]:
    """One trajectory per warmup row: prompt ids, then the solution ids as 'sampled'."""
    examples = load_math_examples(path).examples
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    trajs = []
    for ex in examples:
        solution = ex.metadata.get("solution")
        if not isinstance(solution, str) or not solution.strip():
            raise ValueError(f"{path}: example {ex.id} has no 'solution' text to warmup on")
        t = Trajectory(
            f"warm:{ex.id}", 0, ex.id, ex.problem, [ex.answer], prompt_ids(tokenizer, ex)
        )
        ids = encode_text(tokenizer, solution) + [end]
        t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
        trajs.append(t)
    return trajs


def run_warmup(cfg: CERConfig) -> Path:
    """``assets.init_model`` + SFT on ``assets.warmup`` -> ``<warmup.out>/model``."""
    check_assets(cfg.assets, ["init_model", "warmup"])
    w = cfg.warmup
    sft = SFTRun(w.steps, w.batch_size, cfg.seed, w.context_weight)
    saved, history, n = sft_and_save(
        cfg,
        Path(w.out),
        cfg.assets.init_model,
        lambda tokenizer: solution_trajectories(cfg.assets.warmup, tokenizer),
        w.train,
        sft,
    )
    if current_rank() == 0:
        print(f"[cer warmup] {n} solutions, {w.steps} steps; loss {history[-1:]}")
    return saved
