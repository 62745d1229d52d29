"""π's SFT in ARCO's warmup as the release's (``scripts/sft_pi.py``): one example an agent step,
``warmup.pi_batch`` of them an optimizer step, the loss the token mean over each pair of examples
averaged over the pairs, and the best SFT epoch kept even when the base scores higher; π's and
μ's SFT micro-batches (``warmup.micro_batch_size``) give the whole batch's gradient. Hand-built
trajectories with known step counts, the tiny model and the real training engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arco.config import ArcoConfig
from arco.rubric_model import build_arco_model
from arco.warmup import pi_sft_loss, sft_policy, step_examples, step_view
from common.config import ConfigError, load_config
from common.rollout.trajectory import Step, Trajectory
from common.train import TrainEngine

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
LORA = ["lora.r=4", "lora.lora_alpha=8", "lora.target_modules=[q_proj, v_proj]"]


def trajectory(n_steps: int, first: int = 30) -> Trajectory:
    """Prompt [5, 6, 7]; step j samples [first + 2j, first + 2j + 1]; an observation [50, 51]
    follows every step but the last (an answer)."""
    t = Trajectory(f"g{n_steps}", 0, f"q{n_steps}", "question?", ["a"], [5, 6, 7])
    for j in range(n_steps):
        start = len(t.response_ids)
        t.append([first + 2 * j, first + 2 * j + 1], sampled=True, logprobs=[0.0, 0.0])
        last = j == n_steps - 1
        t.steps.append(Step("answer" if last else "search", start, len(t.response_ids)))
        if not last:
            t.append([50, 51], sampled=False)
    return t


def test_one_example_per_step_is_the_context_before_it_and_its_own_tokens():
    t = trajectory(3)
    # response: [30 31] [50 51] [32 33] [50 51] [34 35]
    assert step_examples([trajectory(2), t]) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    v = step_view(t, 1)
    assert v.input_ids == [5, 6, 7, 30, 31, 50, 51, 32, 33]
    assert v.loss_mask == [0, 0, 0, 0, 1, 1]  # the earlier step is context, not target
    v = step_view(t, 0)
    assert v.input_ids == [5, 6, 7, 30, 31] and v.loss_mask == [1, 1]
    v = step_view(t, 2)
    assert len(v.input_ids) == len(t.input_ids) and v.loss_mask == [0] * 8 + [1, 1]


def test_loss_is_the_token_mean_of_each_pair_averaged_over_pairs():
    # per-token log-probs and target masks of 4 examples with 1, 3, 2 and 6 target tokens
    mask = torch.zeros(4, 6)
    for row, n in enumerate((1, 3, 2, 6)):
        mask[row, :n] = 1
    logp = torch.tensor([-1.0, -2.0, -0.5, -0.25]).unsqueeze(1).expand(4, 6) * mask
    logp = logp - 9.0 * (1 - mask)  # off-target positions must not count
    # pairs: (1·1 + 3·2) / 4 = 1.75 and (2·0.5 + 6·0.25) / 8 = 0.3125; mean 1.03125
    assert pi_sft_loss(logp, mask, 2).item() == pytest.approx(1.03125)
    # group 1: per-example means 1, 2, 0.5, 0.25 -> 0.9375; group 4: 9.5 / 12 tokens
    assert pi_sft_loss(logp, mask, 1).item() == pytest.approx(0.9375)
    assert pi_sft_loss(logp, mask, 4).item() == pytest.approx(9.5 / 12)


def test_pi_loss_group_must_divide_pi_batch():
    with pytest.raises(ConfigError, match="pi_loss_group"):
        load_config(ArcoConfig, CONFIG, ["warmup.pi_batch=6", "warmup.pi_loss_group=4"])


def _engine(tiny_world: Path, *extra: str) -> tuple[ArcoConfig, TrainEngine]:
    cfg = load_config(
        ArcoConfig,
        CONFIG,
        [f"assets.model={tiny_world / 'model'}", *LORA, "train.bf16=false", *extra],
    )
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.head_k)
    cfg.train.grad_accum = 1
    lrs = {"policy": cfg.warmup.pi_lr, "rubric": 0.0, "head": 0.0}
    return cfg, TrainEngine(model, cfg.train, param_groups=model.groups(lrs))


def _policy_lora(model) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if ".policy." in n and "lora_" in n
    }


def test_optimizer_steps_are_batches_of_agent_steps(tiny_world):
    """5 trajectories of 2, 3, 4, 3 and 2 steps: 14 examples; pi_batch 4 makes 3 steps an epoch of
    4 examples each (2 left out, as the release's loop drops an epoch's incomplete accumulation),
    6 in 2 epochs. Batching trajectories instead made 2 steps an epoch (4 + 1 trajectories)."""
    cfg, train = _engine(tiny_world, "warmup.pi_epochs=2", "warmup.pi_batch=4", "warmup.pi_lr=1e-3")
    trajs = [trajectory(n) for n in (2, 3, 4, 3, 2)]
    ems = iter([0.0, 0.1, 0.2])
    report = sft_policy(train, trajs, cfg.warmup, cfg.seed, lambda: next(ems), None)
    assert train.global_step == 6
    assert (report["trajectories"], report["examples"], report["steps_per_epoch"]) == (5, 14, 3)
    for row in report["epochs"][1:]:
        assert (row["optimizer_steps"], row["examples"], row["examples_per_step"]) == (
            3,
            12,
            [4, 4, 4],
        )
    # fewer agent steps than pi_batch: one step on all of them
    cfg, train = _engine(tiny_world, "warmup.pi_epochs=1", "warmup.pi_batch=16")
    ems = iter([0.0, 0.0])
    report = sft_policy(train, trajs, cfg.warmup, cfg.seed, lambda: next(ems), None)
    assert train.global_step == 1 and report["epochs"][1]["examples_per_step"] == [14]


def test_the_best_sft_epoch_is_kept_even_when_the_base_scores_higher(tiny_world):
    """Held-out EM: base 0.6, then epochs 1-3 at 0.1, 0.4, 0.4. The release keeps an SFT epoch
    whatever the base scores: epoch 2 (the tie with epoch 3 goes to the earlier), never epoch 0."""
    cfg, train = _engine(tiny_world, "warmup.pi_epochs=3", "warmup.pi_batch=4", "warmup.pi_lr=1e-2")
    trajs = [trajectory(n) for n in (2, 3, 4)]
    ems, snapshots = iter([0.6, 0.1, 0.4, 0.4]), []

    def select() -> float:  # called on the base, then after every epoch
        snapshots.append(_policy_lora(train.model))
        return next(ems)

    report = sft_policy(train, trajs, cfg.warmup, cfg.seed, select, None)
    assert (report["chosen_epoch"], report["chosen_select_em"]) == (2, 0.4)
    assert report["base_select_em"] == 0.6
    assert [(r["epoch"], r["select_em"]) for r in report["epochs"]] == [
        (0, 0.6),
        (1, 0.1),
        (2, 0.4),
        (3, 0.4),
    ]
    kept = _policy_lora(train.model)
    for name, value in kept.items():
        torch.testing.assert_close(value, snapshots[2][name], rtol=0, atol=0)
    assert any(not torch.equal(kept[n], snapshots[0][n]) for n in kept)  # not the base
    assert any(not torch.equal(kept[n], snapshots[3][n]) for n in kept)  # not the last epoch


def _uneven(n_steps: int, first: int) -> Trajectory:
    """Steps of 1, 2, 3, ... sampled tokens: the groups' token counts differ."""
    t = Trajectory(f"u{first}", 0, f"u{first}", "question?", ["a"], [5, 6, 7])
    for j in range(n_steps):
        start = len(t.response_ids)
        ids = [first + 3 * j + i for i in range(j % 3 + 1)]
        t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
        t.steps.append(Step("search", start, len(t.response_ids)))
        t.append([50, 51], sampled=False)
    return t


def _first_step_grads(train: TrainEngine) -> dict[str, torch.Tensor]:
    """The gradients the first optimizer step of ``train`` sees (recorded, then it steps)."""
    seen: dict[str, torch.Tensor] = {}
    step = train.step

    def record():
        if not seen:
            seen.update(
                {n: p.grad.clone() for n, p in train.model.named_parameters() if p.grad is not None}
            )
        return step()

    train.step = record
    return seen


def test_micro_batches_give_the_whole_batch_gradient(tiny_world):
    """pi_batch 6 in pi_loss_group 2 over examples of uneven lengths: micro-batches of 4 (a group
    split across none, then 2 rows) and of 1 give the gradient of the whole batch at once,
    the release's normalisation (token mean within a pair, mean over the pairs)."""
    trajs = [_uneven(3, 30), _uneven(4, 60)]  # 7 examples: one step of 6
    grads, losses = {}, {}
    for micro in (6, 4, 1):
        cfg, train = _engine(
            tiny_world,
            "warmup.pi_epochs=1",
            "warmup.pi_batch=6",
            "warmup.pi_loss_group=2",
            f"warmup.micro_batch_size={micro}",
        )
        with torch.no_grad():  # π away from B = 0, so every LoRA weight gets a gradient
            g = torch.Generator().manual_seed(3)
            for p in train.model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
        grads[micro] = _first_step_grads(train)
        report = sft_policy(train, trajs, cfg.warmup, cfg.seed, lambda: 0.0, None)
        losses[micro] = report["epochs"][1]["loss"]
        assert train.global_step == 1
    assert grads[6] and all(".policy." in n for n in grads[6])
    for micro in (4, 1):
        assert losses[micro] == pytest.approx(losses[6], abs=1e-6)
        for n, g in grads[6].items():
            torch.testing.assert_close(grads[micro][n], g, rtol=1e-6, atol=1e-6)


def test_row_weights_reproduce_pi_sft_loss():
    # counts 3, 1 | 2, 2 | 4: groups of 2 -> weights 1/(4*3), 1/(4*3), 1/(4*3), 1/(4*3), 1/(4*3)
    from arco.warmup import pi_sft_row_weights

    assert pi_sft_row_weights([3, 1, 2, 2, 4], 2) == pytest.approx([1 / 12] * 5)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 6, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0]] * 2)[:5]
    w = torch.tensor(pi_sft_row_weights(mask.sum(1).tolist(), 2))
    got = (w * -(logp * mask).sum(1)).sum()
    assert got.item() == pytest.approx(pi_sft_loss(logp, mask, 2).item(), abs=1e-7)


def test_mu_micro_batches_give_the_whole_batch_gradient(tiny_world):
    """μ SFT over 5 items (criteria of 3, 1, 4 and 2 tokens, one fixed item without any), one
    step of mu_batch 5: micro-batches of 2 and of 1 give the whole batch's gradient (the CE a
    token mean over the batch's criteria tokens, the MSE a mean over its 5 x 3 scores)."""
    from arco.rubrics import RubricItem
    from arco.warmup import sft_rubric

    def items() -> list[RubricItem]:
        rows = [([5, 6, 7], [20, 21, 2]), ([5, 6], [22]), ([5, 6, 7, 8, 9], [23, 24, 25, 2])]
        rows += [([5, 8], [26, 2]), ([5, 6, 9, 9], [27, 2])]
        out = [
            RubricItem(i, 0, p, criteria_ids=c, target_scores=[0.1 * i, -0.2, 0.5])
            for i, (p, c) in enumerate(rows)
        ]
        out[4].written = False  # fixed criteria: scored, no CE
        return out

    grads, rows = {}, {}
    for micro in (5, 2, 1):
        cfg, train = _engine(
            tiny_world,
            "warmup.mu_epochs=1",
            "warmup.mu_batch=5",
            f"warmup.micro_batch_size={micro}",
        )
        with torch.no_grad():
            g = torch.Generator().manual_seed(4)
            for p in train.model.parameters():
                if p.requires_grad:
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
        grads[micro] = _first_step_grads(train)
        rows[micro] = sft_rubric(train, items(), cfg.warmup, cfg.seed, 0, None)["epochs"][0]
        assert train.global_step == 1
    assert any(n.startswith("head.") for n in grads[5]) and any(".rubric." in n for n in grads[5])
    for micro in (2, 1):
        assert rows[micro]["criteria_ce"] == pytest.approx(rows[5]["criteria_ce"], abs=1e-6)
        assert rows[micro]["score_mse"] == pytest.approx(rows[5]["score_mse"], abs=1e-6)
        for n, g in grads[5].items():
            torch.testing.assert_close(grads[micro][n], g, rtol=1e-6, atol=1e-6)


def test_an_sft_epoch_shows_a_progress_bar_of_its_optimizer_steps(tiny_world, capsys):
    """π's SFT epochs show where they are on stderr (``common.train.progress``): a bar an epoch,
    counted in optimizer steps (14 examples in batches of 4: 3 steps); stdout keeps one line an
    epoch, its result."""
    cfg, train = _engine(tiny_world, "warmup.pi_epochs=2", "warmup.pi_batch=4")
    ems = iter([0.0, 0.1, 0.2])
    trajs = [trajectory(n) for n in (2, 3, 4, 3, 2)]
    sft_policy(train, trajs, cfg.warmup, cfg.seed, lambda: next(ems), None)
    out = capsys.readouterr()
    for epoch in (1, 2):
        assert f"[arco warmup] π epoch {epoch}: 100%" in out.err and "3/3 [" in out.err
        assert f"[arco warmup] π epoch {epoch}: 3 steps of 4 agent steps" in out.out
    assert "%|" not in out.out
