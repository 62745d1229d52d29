"""μ's rows of a trajectory forwarded as one trunk(``rubric.shared_prefix``): the
packing on hand-made sequences, and on the tiny model the pooled features, scores, criteria
log-probs, KL against μ_ref and an update's gradients equal to the per-row path's in fp32, for
every prefix, mode and K."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_arco_ablations import CRITERIA, EPISODES, cfg_for
from test_arco_single_forward import _one_update

from arco.diagnose import criteria_loglik
from arco.losses import masked_token_mean, scatter_positions, token_kl
from arco.rubric_model import build_arco_model
from arco.rubric_prompt import format_criteria
from arco.rubrics import rubric_batch, score_items, trajectory_chunks, trunk_batch
from arco.steps import AgentStep, Episode
from arco.trainer import make_rubric_items
from common.block_causal import (
    PAD,
    block_causal_mask,
    choose_trunk,
    common_length,
    pack_tree,
    pad_trees,
)
from common.rl import logprobs_from_logits
from common.rollout.agent import encode_text

ATOL = 1e-5

# a third trajectory: an invalid turn, then the forced answer; a fourth of one step
MORE = [
    Episode(
        "q3",
        "Who directed Tamsford Lanterns?",
        ["Ora Velk"],
        [
            AgentStep("search", "<search> Tamsford Lanterns </search>", "Lanterns (film).", 2),
            AgentStep("invalid", "I think it is Ora", "Invalid action.", 1),
            AgentStep("answer", "<answer> Ora Velk </answer>", "", 0, forced=True),
        ],
        "Ora Velk",
        1.0,
    ),
    Episode("q4", "Where is Velk Mills?", ["Tamsford"], [AgentStep("answer", "x", "", 3)], "x", 0),
]


# --- the packing, by hand ----------------------------------------------------------------------


def test_pack_tree_puts_each_tail_after_its_branch_point():
    seqs = [[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7], [1, 2]]
    # common starts with [1, 2, 3, 6, 7]: 3, 2, -, 2 (7 in all; [1, 2, 3, 4] gives 3 + 2 + 2)
    assert choose_trunk(seqs) == 2
    tree = pack_tree(seqs)
    assert tree.ids == [1, 2, 3, 6, 7, 4, 5]
    assert tree.positions == [0, 1, 2, 3, 4, 3, 2]
    assert tree.segment == [0, 0, 0, 0, 0, 1, 2]
    assert tree.visible == [1, 2, 3, 4, 5, 3, 2]
    # every sequence read back from the packed row, token for token
    assert tree.index == [[0, 1, 2, 5], [0, 1, 6], [0, 1, 2, 3, 4], [0, 1]]
    for s, idx in zip(seqs, tree.index, strict=True):
        assert [tree.ids[i] for i in idx] == s
        assert [tree.positions[i] for i in idx] == list(range(len(s)))


def test_block_causal_mask_by_hand():
    tree = pack_tree([[1, 2, 3], [1, 9]], trunk=0)  # trunk 1 2 3, tail [9] after 1 token
    ids, pos, seg, vis = pad_trees([tree], pad_id=0, device="cpu")
    assert ids.tolist() == [[1, 2, 3, 9]] and pos.tolist() == [[0, 1, 2, 1]]
    seg = torch.cat([seg, torch.full((1, 1), PAD)], 1)  # one padding column
    vis = torch.cat([vis, torch.zeros(1, 1, dtype=torch.long)], 1)
    allowed = block_causal_mask(seg, vis, torch.float32)[0, 0] == 0
    assert allowed.int().tolist() == [
        [1, 0, 0, 0, 0],  # trunk: causal
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],  # the tail: the trunk's first token, then itself
        [0, 0, 0, 0, 1],  # padding: itself only
    ]
    assert block_causal_mask(seg, vis, torch.bfloat16).dtype == torch.bfloat16


def test_trajectory_chunks_keep_trajectories_whole():
    from arco.rubrics import RubricItem

    items = [RubricItem(t, s, [1]) for t, n in enumerate([2, 3, 1, 4]) for s in range(n)]
    items.insert(1, items.pop(2))  # trajectory 1's first row between trajectory 0's
    assert trajectory_chunks(items, 4)[:2] == [[0, 2], [1, 3, 4, 5]]
    items.insert(2, items.pop(1))
    chunks = trajectory_chunks(items, 4)
    assert [[(items[i].traj, items[i].step) for i in c] for c in chunks] == [
        [(0, 0), (0, 1)],
        [(1, 0), (1, 1), (1, 2), (2, 0)],
        [(3, 0), (3, 1), (3, 2), (3, 3)],
    ]


# --- the tiny model: per-row against trunk -----------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_world / "model")


def _model(cfg):
    torch.manual_seed(0)
    model = build_arco_model(cfg.assets.model, cfg.lora.as_peft(), cfg.rubric.head_k)
    with torch.no_grad():  # every adapter off its start and apart from its reference: KL > 0
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def _items(cfg, tokenizer, episodes):
    items = make_rubric_items(cfg, episodes, tokenizer)
    if cfg.rubric.mode == "adaptive":  # criteria as μ might write them, one set per step
        for it in items:
            words = [f"step {it.step} c{j}" for j in range(cfg.rubric.k)]
            it.criteria_ids = encode_text(tokenizer, format_criteria(words))
            it.criteria_ids.append(tokenizer.eos_token_id)
    return items


def _pooled_hook(model):
    seen: list[torch.Tensor] = []
    hook = model.head.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    return seen, hook


@torch.no_grad()
def _per_row(model, items, pad_id):
    ids, attn, crit = rubric_batch(items, pad_id, "cpu")
    at = F.pad(crit.bool(), (0, 1))
    seen, hook = _pooled_hook(model)
    logits, scores = model("rubric", ids, attn, pool_mask=attn, logit_mask=at)
    hook.remove()
    ref, _ = model("rubric_ref", ids, attn, logit_mask=at)
    kl = masked_token_mean(scatter_positions(token_kl(logits, ref), crit.bool()), crit)
    logp = logprobs_from_logits(logits, ids[:, 1:][crit.bool()])
    tokens = int(attn.sum())
    return {"pooled": seen[0], "scores": scores, "logp": logp, "kl": kl, "tokens": tokens}


@torch.no_grad()
def _trunk(model, items, pad_id):
    tb = trunk_batch(items, pad_id, "cpu")
    fwd = {"position_ids": tb.positions, "logit_mask": tb.logit_mask}
    seen, hook = _pooled_hook(model)
    logits, scores = model("rubric", tb.ids, tb.mask, pool_mask=tb.pool, **fwd)
    hook.remove()
    ref, _ = model("rubric_ref", tb.ids, tb.mask, **fwd)
    kl = tb.item_mean(token_kl(logits, ref)[tb.crit_at], len(items))
    logp = logprobs_from_logits(logits[tb.crit_at], tb.crit_target)
    pooled = seen[0][tb.group, tb.row]  # [G, R, H] -> [M, H]
    return {
        "pooled": pooled,
        "scores": tb.item_scores(scores),
        "logp": logp,
        "kl": kl,
        "tokens": tb.tokens,
        "row_tokens": tb.row_tokens,
    }


CASES = [
    (prefix, mode, k, "user")
    for prefix in ("before", "after", "none")
    for mode in ("adaptive", "fixed", "none")
    for k in ((1, 3) if mode == "adaptive" else (3,))
] + [("before", "adaptive", 3, "system"), ("none", "fixed", 3, "system")]


@pytest.mark.parametrize(("prefix", "mode", "k", "request_in"), CASES)
def test_trunk_equals_per_row(tiny_world, tokenizer, prefix, mode, k, request_in):
    extra = [f"rubric.prefix={prefix}", f"rubric.mode={mode}", f"rubric.k={k}"]
    extra.append(f"rubric.request_in={request_in}")
    if mode == "fixed":
        extra.append(f"rubric.criteria_file={CRITERIA}")
    cfg = cfg_for(tiny_world, *extra)
    model = _model(cfg)
    items = _items(cfg, tokenizer, [*EPISODES, *MORE])
    pad = tokenizer.pad_token_id
    old, new = _per_row(model, items, pad), _trunk(model, items, pad)
    assert new["row_tokens"] == old["tokens"]  # the rows are the per-row path's, token for token
    assert new["tokens"] < old["tokens"]  # and something is shared in every prefix mode
    for key in ("pooled", "scores", "logp", "kl"):
        assert new[key].shape == old[key].shape, key
        torch.testing.assert_close(new[key], old[key], rtol=0, atol=ATOL, msg=key)
    if mode == "adaptive":
        assert old["logp"].numel() > 0 and float(old["kl"].min()) > 0
    else:  # criteria not μ's: nothing to take log-probs of
        assert old["logp"].numel() == 0 and new["logp"].numel() == 0
    scored = {}
    for shared in (False, True):
        score_items(model, items, pad, 3, shared=shared)  # chunks cut trajectories apart or not
        scored[shared] = torch.tensor([it.scores for it in items])
    torch.testing.assert_close(scored[True], scored[False], rtol=0, atol=ATOL)
    torch.testing.assert_close(scored[True], old["scores"], rtol=0, atol=ATOL)


def test_what_each_prefix_shares(tiny_world, tokenizer):
    """What a step's row shares with the trunk (the last step's row, which holds the most
    history): before, the system text, the question and the history before the step; after, the
    history through the step's own action; the tail then starts at the budget line. none: the
    system text and the question only (the action comes before the request)."""
    ep = MORE[0]  # three steps, three different actions
    for prefix in ("before", "after", "none"):
        cfg = cfg_for(tiny_world, f"rubric.prefix={prefix}")
        items = _items(cfg, tokenizer, [ep])
        tree = pack_tree([it.input_ids for it in items])
        assert tree.trunk == 2
        for t, it in enumerate(items[:2]):
            branch = common_length(it.input_ids, items[2].input_ids)
            shared = tokenizer.decode(it.input_ids[:branch])
            tail = tokenizer.decode(it.input_ids[branch:])
            assert ep.question in shared and "Question:" in shared
            if prefix == "none":
                assert "Trajectory" not in shared and "Searches" not in shared
                request = cfg.rubric.request.format(k=3, example=format_criteria(["..."] * 3))
                assert ep.steps[t].action.split()[-1] in tail and request in tail
            else:
                shown = t + 1 if prefix == "after" else t
                assert shared.count("Action: ") == shown, (prefix, t, shared)
                assert "Searches remaining before this action" in tail
        tb = trunk_batch(items, tokenizer.pad_token_id, "cpu")
        branches = [common_length(it.input_ids, items[2].input_ids) for it in items[:2]]
        assert tb.tokens == tb.row_tokens - sum(branches)


def test_request_in_system_is_shared(tiny_world, tokenizer):
    """rubric.request_in=system: the request is in the shared part of every row, the tails are
    the budget, the action and the criteria, and the packed trajectory has exactly the request's
    tokens fewer per non-trunk row than with the request in the user text."""
    ep = MORE[0]
    packed = {}
    for place in ("user", "system"):
        cfg = cfg_for(tiny_world, f"rubric.request_in={place}")
        items = _items(cfg, tokenizer, [ep])
        request = cfg.rubric.request.format(k=3, example=format_criteria(["..."] * 3))
        for it in items[:2]:
            branch = common_length(it.input_ids, items[2].input_ids)
            shared = tokenizer.decode(it.input_ids[:branch])
            tail = tokenizer.decode(it.input_ids[branch:])
            assert (request in shared) == (place == "system")
            assert (request in tail) == (place == "user")
            assert "Searches remaining before this action" in tail
        packed[place] = trunk_batch(items, tokenizer.pad_token_id, "cpu")
    assert packed["system"].row_tokens == packed["user"].row_tokens  # the same tokens, moved
    assert packed["system"].tokens < packed["user"].tokens


@pytest.mark.parametrize("single", ["true", "false"])
@pytest.mark.parametrize("prefix", ["before", "after", "none"])
def test_update_gradients_equal(tiny_world, tokenizer, single, prefix):
    """One dense update (μ's micro-steps, then π's) on both paths: step scores, advantages,
    losses, KL and every parameter's gradient the optimizer step saw, within 1e-5."""
    extra = [f"rl.mu_single_forward={single}", f"rubric.prefix={prefix}", "lora.lora_dropout=0"]
    old = _one_update(tiny_world, tokenizer, single == "true", *extra, "rubric.shared_prefix=false")
    new = _one_update(tiny_world, tokenizer, single == "true", *extra)
    torch.testing.assert_close(
        torch.tensor(new["scores"]), torch.tensor(old["scores"]), rtol=0, atol=ATOL
    )
    for a, b in zip(new["adv"], old["adv"], strict=True):
        assert a == pytest.approx(b, abs=ATOL)
    assert set(new["stats"]) == set(old["stats"]) and old["stats"]["mu_kl"] > 0
    for key, v in old["stats"].items():
        if not key.startswith("grad_norm"):
            assert new["stats"][key] == pytest.approx(v, abs=ATOL), key
    rubric = [n for n in old["grads"] if ".rubric." in n or n.startswith("head.")]
    assert rubric and set(new["grads"]) == set(old["grads"])
    for n in rubric:
        torch.testing.assert_close(new["grads"][n], old["grads"][n], rtol=1e-4, atol=ATOL)
    assert any(float(old["grads"][n].abs().max()) > 1e-4 for n in rubric if "lora_B" in n)


def test_diagnose_loglik_equal(tiny_world, tokenizer):
    """The candidates' criteria log-likelihoods (action identification) on both paths: the
    candidates of one case share their prompt up to the action."""
    cfg = cfg_for(tiny_world)
    model = _model(cfg)
    items = _items(cfg, tokenizer, [*EPISODES, *MORE])
    for it in items:
        it.traj = it.step  # groups of rows that share some start, as a case's candidates do
    pad = tokenizer.pad_token_id
    old = criteria_loglik(model, items, pad, 4)
    new = criteria_loglik(model, items, pad, 4, shared=True)
    # sums of ~30 token log-probs of about -10 each: float32 rounds such a sum at ~3e-5 (the
    # token log-probs themselves agree within 1e-5, test_trunk_equals_per_row)
    torch.testing.assert_close(torch.tensor(new), torch.tensor(old), rtol=1e-6, atol=ATOL)
    assert all(v < 0 for v in old)


def test_config_default_and_switch(tiny_world):
    assert cfg_for(tiny_world).rubric.shared_prefix is True
    assert cfg_for(tiny_world, "rubric.shared_prefix=false").rubric.shared_prefix is False
