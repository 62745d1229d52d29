"""ARCO's data order (arco/trainer.py): a fresh permutation per epoch and ceil(N / B) batches an
epoch, as the release; an epoch's last batch filled up from the same epoch's permutation; the
batch global, each rank taking its contiguous slice; a function of the step alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from arco.config import ArcoConfig
from arco.trainer import check_batches, epoch_order, rank_step_questions, step_questions
from common.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def rl(**kw) -> SimpleNamespace:
    base = dict(sparse_steps=6, sparse_questions=2, sparse_n=2, dense_questions=4,
                micro_batch_size=2)  # fmt: skip
    return SimpleNamespace(**(base | kw))


def test_every_epoch_is_a_fresh_seeded_permutation():
    e = [epoch_order(5, 0, k) for k in range(4)]
    assert all(sorted(x) == [0, 1, 2, 3, 4] for x in e)
    assert len({tuple(x) for x in e}) == 4  # four epochs, four orders
    assert epoch_order(5, 0, 1) == epoch_order(5, 0, 1)  # (seed, epoch) alone decide it
    assert epoch_order(50, 0, 0) != epoch_order(50, 1, 0)


def test_batches_walk_each_epoch_and_fill_its_last_batch_from_the_same_epoch():
    """N = 5: sparse B = 2 -> 3 batches an epoch (the third 1 + 1 filled), 6 sparse steps = 2
    epochs; dense B = 4 -> 2 batches an epoch (the second 1 + 3 filled), from epoch 2 on."""
    e = [epoch_order(5, 7, k) for k in range(4)]
    got = [step_questions(s, rl(), 5, 7) for s in range(1, 10)]
    assert got == [
        e[0][0:2], e[0][2:4], [e[0][4], e[0][0]],
        e[1][0:2], e[1][2:4], [e[1][4], e[1][0]],
        e[2][0:4], [e[2][4], e[2][0], e[2][1], e[2][2]],
        e[3][0:4],
    ]  # fmt: skip
    # the sparse phase ending inside an epoch: the dense phase still starts a new one
    e = [epoch_order(5, 7, k) for k in range(3)]
    short = rl(sparse_steps=4)  # epochs 0 and 1 begun
    assert step_questions(4, short, 5, 7) == e[1][0:2]
    assert step_questions(5, short, 5, 7) == e[2][0:4]


def test_two_ranks_take_contiguous_halves_of_the_one_rank_batch():
    for step in range(1, 10):
        one = step_questions(step, rl(), 5, 3)
        halves = [rank_step_questions(step, rl(), 5, 3, r, 2) for r in (0, 1)]
        half = len(one) // 2
        assert halves == [one[:half], one[half:]]


def test_paper_schedule_375_sparse_then_160_dense_steps_cover_every_epoch():
    """The paper configs: N = 2,000, 125 sparse batches of 16 an epoch x 3 = 375 steps, then
    32 dense batches of 64 an epoch x 5 = 160 (the release's batches, the last one filled)."""
    cfg = load_config(ArcoConfig, ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml")
    r, n = cfg.rl, 2000
    assert (r.sparse_steps, r.dense_steps, cfg.steps) == (375, 160, 535)
    epochs = [
        [step_questions(s, r, n, cfg.seed) for s in range(1 + 125 * k, 126 + 125 * k)]
        for k in range(3)
    ] + [
        [step_questions(s, r, n, cfg.seed) for s in range(376 + 32 * k, 408 + 32 * k)]
        for k in range(5)
    ]
    for k, batches in enumerate(epochs):
        size = 16 if k < 3 else 64
        assert all(len(b) == len(set(b)) == size for b in batches)
        flat = [q for b in batches for q in b]
        assert set(flat) == set(range(n))  # every question, every epoch
        order = epoch_order(n, cfg.seed, k)
        assert flat[:n] == order  # in this epoch's own permutation
        assert flat[n:] == order[: len(flat) - n]  # dense: 16 + 48 filled from its start
    assert len(epochs[3][-1]) == 64 and epochs[3][-1][16:] == epoch_order(n, cfg.seed, 3)[:48]
    # 8 ranks: each takes 2 of a sparse batch and 8 of a dense one
    assert rank_step_questions(376, r, n, cfg.seed, 7, 8) == epochs[3][0][56:64]
    assert check_batches(r, 8, n) == 2  # 8 dense questions a rank / micro-batch 4


def test_outcome_only_keeps_the_sparse_batch_and_walks_on_through_epochs():
    """outcome_only turns the 160 dense steps into sparse ones (16 questions x 4): 535 sparse
    steps are 4 whole epochs of 125 batches and 35 batches of a fifth."""
    cfg = load_config(
        ArcoConfig, ROOT / "arco" / "configs" / "qwen3_4b_hotpotqa.yaml", ["method=outcome_only"]
    )
    r, n, sparse = cfg.rl, 2000, cfg.sparse_steps
    assert (sparse, cfg.dense_steps) == (535, 0)
    assert step_questions(376, r, n, cfg.seed, sparse) == epoch_order(n, cfg.seed, 3)[:16]
    last = step_questions(535, r, n, cfg.seed, sparse)
    assert last == epoch_order(n, cfg.seed, 4)[34 * 16 : 35 * 16]
    assert rank_step_questions(535, r, n, cfg.seed, 3, 4, sparse) == last[12:16]
    assert check_batches(r, 4, n) == 4  # 4 sparse questions x 4 a rank / micro-batch 4


def test_batch_sizes_that_do_not_fit_the_ranks_or_the_data_stop_in_one_line():
    with pytest.raises(
        ConfigError, match=r"^rl.sparse_questions=2 does not split over world size 4"
    ):
        check_batches(rl(), 4)
    with pytest.raises(ConfigError, match=r"^rl.dense_questions gives 1 trajectories per rank"):
        check_batches(rl(sparse_questions=4, sparse_n=1), 4)  # 4 dense / 4 ranks < micro 2
    with pytest.raises(ConfigError, match=r"must equal dense_questions = 4"):
        check_batches(rl(sparse_n=4), 1)
    with pytest.raises(
        ConfigError, match=r"^rl.dense_questions=4 exceeds the 3 training questions"
    ):
        check_batches(rl(), 1, 3)
    assert check_batches(rl(), 2, 5) == 1


def test_arco_train_refuses_a_batch_the_ranks_cannot_split_before_anything_loads(
    monkeypatch, capsys, tmp_path
):
    """Under a launcher of 3 ranks the tiny config's 8 sparse questions stop `arco train` with
    exit 2 and one line, before the assets (none in tmp_path) are checked."""
    from arco.cli import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--config", str(ROOT / "arco" / "configs" / "tiny.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "arco train: error: rl.sparse_questions=8 does not split over world size 3"
    )
    assert "\n" not in err
