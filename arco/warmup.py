"""ARCO's supervised warmup (the paper's "Supervised warmup"; docs/arco_internals.md, "Warmups,
fixed criteria, μ outside the trainer, diagnose" and "Long runs: checkpoints and a resumable
warmup"):

    1. teacher trajectories   (llm: a cheap LLM plays the policy; oracle: the tiny agent does;
                               file: the ARCO release's warmup data, ``arco.release_import``)
    2. hindsight annotation   (llm: a strong LLM; oracle: the tiny world, which knows which
                               searches found a supporting document and whether R = 1)
    3. projection             scores onto {Σ_t mean_k = R, [-1, 1]}; unparseable ones dropped
    4. π SFT                  the steps of R = 1 trajectories with > 1 step, one example a
                               step, ``warmup.pi_batch`` steps an optimizer step (the
                               release's 2 × 32, here ``warmup.micro_batch_size`` a
                               forward, accumulated); the best SFT epoch on held-out training
                               questions (never the reported dev split) is kept; or π
                               taken from an earlier warmup (``warmup.policy_from``)
    5. μ SFT                  steps of trajectories with > 1 step whose decomposition holds;
                               token-mean CE on the criteria JSON + EOS + 10 × score MSE,
                               ``warmup.mu_batch`` steps an optimizer step, accumulated
                               over micro-batches as π's (one process: the warmup's
                               gradient accumulation is the plain engine's)

Writes ``warmup_dir``: the adapters and head (``save_arco``), ``report.json`` (counts, teacher
cost, losses, the epoch choice) and ``data.jsonl`` (the annotated trajectories).

The LLM teacher's requests (``collect_llm``) are estimated before the first is sent, capped by
``warmup.max_api_calls`` / ``warmup.max_api_usd`` (``warmup_budget``), cached by request in
``warmup.api_cache_dir`` (``teacher_cache``, shared by every warmup) and sent by rank 0 alone
under a launcher (``common.api_budget.on_rank_zero``).

A warmup resumes by phase (``WarmupPhases``): each writes its result into ``warmup_dir/phases/``
(``collect.json`` + ``collect.safetensors``: the trajectories, raw annotations, the fresh
adapters and head and the random streams; ``pi.json`` + ``pi.safetensors``: π's adapter and
report; plain formats, ``common.train.plain_state``: reading them runs no code) and then,
atomically, its marker ``<phase>.done`` holding a hash of the warmup's settings
(``warmup_settings``) and the settings RL must share with it (``warmup_rl_settings``); μ's
result is the folder itself. A rerun with the same ``warmup_dir`` skips each leading phase whose
marker holds this config's hash (``[arco warmup] π phase done at <path>, skipped``) and runs the
rest; other settings run every phase again. An older warmup's ``<phase>.pt`` (a pickle) is never
read: its phase runs again.

``run_warmup`` runs on the RL frame's pieces: the run folder (``open_run_folder``: the lock, and
metrics.jsonl trimmed to the resume point, π's rows kept when π's phase is done), its
``MetricsLogger`` from that step, ``progress`` bars over an SFT epoch's optimizer steps (on
stderr) and the random streams as a checkpoint saves them (``rng_state``). Its steps:
``warmup_questions``, ``probe_services``, ``build_parts``, ``collect_phase``, ``sft_sets``,
``pi_phase``, ``mu_phase``.

The adapters and the head are created after the warmup seeds torch, Python and numpy with
``seed`` (a process's own seed differs from run to run), so two warmups of one config create the
same weights. ``arco train`` starts only from a finished warmup whose RL settings are its own
(``arco.warmup_state.check_warmup_finished``: ``phases/mu.done`` present, its ``rl_settings``
equal).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from arco.config import ArcoConfig, ArcoWarmupConfig, RubricConfig
from arco.environment import build_environment
from arco.losses import rubric_sft_loss, scatter_positions
from arco.projection import decomposition_holds, project_scores
from arco.release_import import ReleaseImport, import_release
from arco.rubric_model import ArcoModel, build_arco_model, load_adapters, save_arco
from arco.rubric_prompt import format_criteria
from arco.rubrics import RubricItem, rubric_batch, write_criteria
from arco.steps import AgentStep, Episode, agent_step, episode_from_trajectory
from arco.teacher import (
    ANNOTATOR_TOKENS_PER_STEP,
    PLAYER_MAX_TOKENS,
    StepAnnotation,
    annotate,
    oracle_annotation,
    oracle_support,
    teacher_rollouts,
    warmup_estimate,
)
from arco.warmup_state import warmup_rl_settings
from common.api_budget import ApiBudget, estimate_text, on_rank_zero, usage_text
from common.config import config_to_dict
from common.data import QAExample
from common.jsonl import write_atomic, write_jsonl_atomic
from common.llm_client import LLMClient
from common.retrieval.base import Doc
from common.retrieval.client import probe_retrieval
from common.retrieval.per_question import paragraph_docs
from common.rl import logprobs_from_logits
from common.rl_loop import build_engine, evaluate
from common.rollout import AgentConfig, Trajectory, run_agent
from common.rollout.agent import (
    budget_note,
    build_prompt_ids,
    encode_text,
    first_budget,
    render_observation,
)
from common.rollout.batch import collate, padding_id
from common.rollout.protocols import get_protocol
from common.rollout.trajectory import Step
from common.run_config import EngineConfig
from common.train import MetricsLogger, TrainEngine
from common.train.checkpoint import rng_state, set_rng_state
from common.train.config import TrainConfig
from common.train.distributed import current_rank
from common.train.logging import progress
from common.train.plain_state import exists as _plain_exists
from common.train.plain_state import load_plain, save_plain
from common.train.run_folder import open_run_folder


def _lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress_ = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1 + math.cos(math.pi * min(progress_, 1.0)))


def _set_lrs(train: TrainEngine, lrs: dict[str, float], factor: float) -> None:
    for g in train.optimizer.param_groups:
        g["lr"] = lrs.get(g["name"], 0.0) * factor


def trajectory_from_episode(
    ep: Episode, tokenizer, agent: AgentConfig, docs: Mapping[str, Doc] | None = None
) -> Trajectory:
    """The token view of a text episode (an LLM teacher's) as ``run_agent`` builds a policy's for
    the same play: the prompt (with the budget statement under ``agent.state_budget``), the
    actions as the sampled tokens (loss mask 1), and inserted between them a search's observation
    in the protocol's frame cut to ``agent.max_obs_tokens`` (the budget statement between body
    and tail), the invalid-action message (the same statement inside it) after an invalid turn
    and the forced-answer message before the forced turn. Step ``j`` is the agent's turn ``j``.

    ``docs`` (doc id -> the document a search returned, uncut) renders each search's documents
    with ``render_observation``, so the ids are token for token the agent's; without it (a
    hand-built episode) the observation's text is encoded and cut."""
    protocol = get_protocol(agent.protocol)
    prompt = build_prompt_ids(
        tokenizer, protocol, ep.question, agent.instruction, first_budget(agent)
    )
    t = Trajectory(
        f"teacher:{ep.question_id}",
        ep.metadata.get("sample", 0),
        ep.question_id,
        ep.question,
        ep.golden_answers,
        prompt,
    )
    head, _, tail = protocol.observation([], agent.obs_titles)
    head_ids, tail_ids = encode_text(tokenizer, head), encode_text(tokenizer, tail)
    for turn, s in enumerate(ep.steps):
        if s.forced and not t.used_forced_turn:
            t.used_forced_turn = True
            t.append(encode_text(tokenizer, protocol.force_answer_message()), sampled=False)
        ids = encode_text(tokenizer, s.action)
        start = len(t.response_ids)
        t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
        t.steps.append(Step(s.kind, start, len(t.response_ids), forced=s.forced))
        if s.forced or s.kind == "answer":
            continue
        note = budget_note(protocol, agent, turn)
        if s.kind == "search" and docs is not None:
            shown = [docs[i] for i in s.doc_ids]
            obs = render_observation(
                tokenizer, protocol, shown, agent.max_obs_tokens, agent.obs_titles, note
            )[0]
        elif s.kind == "search":
            note_ids = encode_text(tokenizer, note)
            room = max(agent.max_obs_tokens - len(head_ids) - len(note_ids) - len(tail_ids), 0)
            body = encode_text(tokenizer, s.observation)[:room]
            obs = head_ids + body + note_ids + tail_ids
        else:
            i_head, i_body, i_tail = protocol.invalid_observation()
            obs = encode_text(tokenizer, i_head + i_body + note + i_tail)
        t.append(obs, sampled=False)
    t.answer, t.done = ep.answer, True
    return t


def shown_as_the_agent(
    ep: Episode, tokenizer, agent: AgentConfig, docs: Mapping[str, Doc]
) -> Episode:
    """``ep`` with each search's observation the text ``run_agent`` records for it at that turn
    (``Step.observation``): its documents' body cut where the agent cuts it, the budget statement
    of the turn counted against ``agent.max_obs_tokens``, so that μ's prompts for the teacher's
    play are RL's for the same play."""
    protocol = get_protocol(agent.protocol)
    steps = []
    for turn, s in enumerate(ep.steps):
        if s.kind == "search" and s.observation:
            text = render_observation(
                tokenizer,
                protocol,
                [docs[i] for i in s.doc_ids],
                agent.max_obs_tokens,
                agent.obs_titles,
                budget_note(protocol, agent, turn),
            )[2]
            s = agent_step(s.kind, s.action, text, s.searches_left, s.forced, s.doc_ids)
        steps.append(s)
    return replace(ep, steps=steps)


def collect_oracle(
    cfg: ArcoConfig, engine, tokenizer, retriever, agent_cfg, examples: Sequence[QAExample]
) -> tuple[list[Trajectory], list[Episode], list[list[StepAnnotation] | None], dict]:
    """The agent plays (temperature ``warmup.temperature``); the data's supporting documents
    annotate (``oracle_support``: by id in the tiny world, by title in HotpotQA)."""
    play = replace(agent_cfg, temperature=cfg.warmup.temperature)
    print(
        f"[arco warmup] playing {len(examples)} questions x {cfg.warmup.samples} for the oracle",
        flush=True,
    )
    trajs = run_agent(
        engine,
        tokenizer,
        retriever,
        examples,
        cfg.warmup.samples,
        play,
        group_prefix="warmup:",
        adapter="policy",
        seed=cfg.seed,
    )
    by_id = {ex.id: ex for ex in examples}
    episodes = [episode_from_trajectory(t, tokenizer, cfg.env.max_searches) for t in trajs]
    annotations: list[list[StepAnnotation] | None] = []
    counts = {"episodes": len(episodes), "ok": 0, "no_support": 0}
    for ep, traj in zip(episodes, trajs, strict=True):
        support = oracle_support(ep, traj, by_id[ep.question_id].metadata)
        if support is None or not ep.steps:
            counts["no_support"] += 1
            annotations.append(None)
            continue
        annotations.append(oracle_annotation(support[0], cfg.rubric.k, support[1]))
        counts["ok"] += 1
    return trajs, episodes, annotations, counts


def collect_release(
    tokenizer, agent_cfg, imported: ReleaseImport
) -> tuple[list[Trajectory], list[Episode], list[list[StepAnnotation] | None], dict]:
    """The release's warmup data (``warmup.teacher=file``, ``arco.release_import``) as
    ``collect_llm`` returns its collection: each search's paragraph shown as the agent shows it
    (``shown_as_the_agent``) and the token view built in the agent's own frame
    (``trajectory_from_episode``, the paragraph as the document). No request."""
    by_episode = [
        {d.id: d for d in paragraph_docs(ep.metadata["paragraphs"], ep.question_id)}
        for ep in imported.episodes
    ]
    episodes = [
        shown_as_the_agent(ep, tokenizer, agent_cfg, docs)
        for ep, docs in zip(imported.episodes, by_episode, strict=True)
    ]
    trajs = [
        trajectory_from_episode(ep, tokenizer, agent_cfg, docs)
        for ep, docs in zip(episodes, by_episode, strict=True)
    ]
    return trajs, episodes, list(imported.annotations), dict(imported.counts)


def teacher_clients(
    cfg: ArcoConfig, cache: Path, budget: ApiBudget | None = None
) -> tuple[LLMClient, LLMClient]:
    """The warmup's LLM player (``assets.teacher_*``) and hindsight annotator
    (``assets.annotator_*``), each with its own cache under ``cache``, their prices
    (``warmup.*_usd_per_mtok``) and the one ``budget`` they share."""
    a, w = cfg.assets, cfg.warmup
    common_kw = dict(
        api_key_env=a.api_key_env,
        max_concurrency=w.teacher_concurrency,
        timeout=w.teacher_timeout_s,
        backoff=w.teacher_backoff_s,
        budget=budget,
    )
    player = LLMClient(
        a.teacher_endpoint,
        a.teacher_model,
        cache_dir=str(cache / "player"),
        temperature=w.temperature,
        max_tokens=PLAYER_MAX_TOKENS,
        price_prompt_per_mtok=w.player_usd_per_mtok[0],
        price_completion_per_mtok=w.player_usd_per_mtok[1],
        **common_kw,
    )
    annotator = LLMClient(
        a.annotator_endpoint,
        a.annotator_model,
        cache_dir=str(cache / "annotator"),
        temperature=0.0,
        max_tokens=ANNOTATOR_TOKENS_PER_STEP * (cfg.env.max_searches + 1),
        price_prompt_per_mtok=w.annotator_usd_per_mtok[0],
        price_completion_per_mtok=w.annotator_usd_per_mtok[1],
        **common_kw,
    )
    return player, annotator


def warmup_budget(w: ArcoWarmupConfig, cache: Path) -> ApiBudget:
    """The warmup's API cap (``warmup.max_api_calls``, ``warmup.max_api_usd``; 0: none)."""
    return ApiBudget.for_section("warmup", w, cache)


def collect_llm(
    cfg: ArcoConfig, tokenizer, retriever, agent_cfg, examples: Sequence[QAExample], cache: Path
) -> tuple[list[Trajectory], list[Episode], list[list[StepAnnotation] | None], dict]:
    """An LLM plays the policy (ReAct text) and a stronger one annotates in hindsight; both
    through ``LLMClient`` (cached, concurrent, cost counted, one budget: ``warmup_budget``).
    Failures are dropped and counted. Before the first request: the estimate of what it costs
    (``arco.teacher.warmup_estimate``); after the last: what it spent."""
    budget = warmup_budget(cfg.warmup, cache)
    player, annotator = teacher_clients(cfg, cache, budget)
    estimate = warmup_estimate(
        player,
        annotator,
        examples,
        cfg.warmup.samples,
        cfg.env.max_searches,
        cfg.rubric.k,
        agent_cfg.max_obs_tokens,
        cache_tag=f"seed{cfg.seed}",
    )
    print(estimate_text("[arco warmup]", estimate, budget.describe()), flush=True)

    protocol = get_protocol(agent_cfg.protocol)
    returned: dict[str, dict[str, Doc]] = {}  # question id -> doc id -> the document, uncut

    def search(ex: QAExample, query: str) -> tuple[str, tuple[str, ...]]:
        """The policy's observation body as the agent shows it (distractor: the paragraph
        without its title), cut at ``agent.max_obs_tokens``."""
        if hasattr(retriever, "search_for"):
            where = ex.metadata.get("paragraphs", ex.id)
            docs = retriever.search_for(where, [query], agent_cfg.topk)[0]
        else:
            docs = retriever.search([query], agent_cfg.topk)[0]
        returned.setdefault(ex.id, {}).update((d.id, d) for d in docs)
        text = render_observation(
            tokenizer, protocol, docs, agent_cfg.max_obs_tokens, agent_cfg.obs_titles
        )[2]
        return text, tuple(d.id for d in docs)

    episodes, counts = teacher_rollouts(
        player,
        examples,
        search,
        cfg.warmup.samples,
        cfg.env.max_searches,
        cache_tag=f"seed{cfg.seed}",
    )
    # the teacher saw each paragraph cut without the turn's budget statement (its search does
    # not know the turn); the episodes keep the agent's cut, which makes room for the statement
    by_episode = [returned.get(ep.question_id, {}) for ep in episodes]
    episodes = [
        shown_as_the_agent(ep, tokenizer, agent_cfg, docs)
        for ep, docs in zip(episodes, by_episode, strict=True)
    ]
    result = annotate(annotator, episodes, cfg.rubric.k)
    player.close()
    annotator.close()
    counts = {**counts, **{f"annotation/{k}": v for k, v in result.counts.items()}}
    counts["player_usage"] = player.stats.as_dict()
    counts["annotator_usage"] = result.usage
    usage = {"player": counts["player_usage"], "annotator": counts["annotator_usage"]}
    print(usage_text("[arco warmup]", usage), flush=True)
    trajs = [
        trajectory_from_episode(ep, tokenizer, agent_cfg, docs)
        for ep, docs in zip(episodes, by_episode, strict=True)
    ]
    return trajs, episodes, result.annotations, counts


def sft_targets(projected: Sequence[float], head_k: int) -> list[float]:
    """The head's warmup targets for one step from its K projected teacher scores: the scores
    themselves, or for a one-score head (rubric mode none: w/o Rubric, the PRM baseline) their
    mean, the projected step score, so that Σ_t target_t = R as the projection guarantees."""
    if head_k == len(projected):
        return [float(x) for x in projected]
    if head_k == 1:
        return [float(sum(projected) / len(projected))]
    raise ValueError(f"a head of {head_k} scores cannot learn {len(projected)} teacher scores")


def project_and_filter(
    episodes: Sequence[Episode], annotations: Sequence[list[StepAnnotation] | None], tol: float
) -> tuple[list[int], list[int], dict[str, int]]:
    """Project every annotation (in place); returns the indices for π SFT (R = 1, > 1 step) and
    for μ SFT (> 1 step, decomposition holds within ``tol``)."""
    pi, mu = [], []
    counts = {"dropped": 0, "one_step": 0, "decomposition_fails": 0}
    for i, (ep, ann) in enumerate(zip(episodes, annotations, strict=True)):
        if ann is None:
            counts["dropped"] += 1
            continue
        scores = project_scores([s.scores for s in ann], ep.reward)
        for s, row in zip(ann, scores.tolist(), strict=True):
            s.scores = row
        if len(ep.steps) <= 1:
            counts["one_step"] += 1
            continue
        if ep.reward == 1.0:
            pi.append(i)
        if decomposition_holds(scores, ep.reward, tol):
            mu.append(i)
        else:
            counts["decomposition_fails"] += 1
    return pi, mu, counts


def step_examples(trajs: Sequence[Trajectory]) -> list[tuple[int, int]]:
    """π SFT's examples, one per agent step as the release's (``build_pi_sft_data``): (trajectory,
    step) for every step with a sampled token."""
    return [
        (i, j)
        for i, t in enumerate(trajs)
        for j, s in enumerate(t.steps)
        if any(t.loss_mask[s.start : s.end])
    ]


def step_view(t: Trajectory, j: int) -> Trajectory:
    """Step ``j`` of ``t`` as one SFT example: the context the policy saw before it (prompt,
    earlier turns, observations and messages) with the step's sampled tokens as the only
    target; ``t``'s tokens cut at the step's end, so the same tokens the agent saw."""
    s = t.steps[j]
    v = Trajectory(t.group_id, t.sample_index, t.question_id, t.question, [], list(t.prompt_ids))
    v.response_ids = list(t.response_ids[: s.end])
    v.loss_mask = [0] * s.start + list(t.loss_mask[s.start : s.end])
    v.sampling_logprobs = [0.0] * s.end
    return v


def target_logprobs(
    train: TrainEngine,
    adapter: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    pool: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token_{t+1}) under ``adapter`` at the label positions where ``mask`` [B, T-1] is 1,
    0 elsewhere ([B, T-1]); the logits exist at those positions only. With ``pool`` also the
    head's scores [B, K] on the mean over the attention mask."""
    where = mask.bool()
    logits, scores = train(
        adapter,
        input_ids,
        attention_mask,
        pool_mask=attention_mask if pool else None,
        logit_mask=F.pad(where, (0, 1)),
    )  # [n, V]
    logp = logprobs_from_logits(logits, input_ids[:, 1:][where])
    return scatter_positions(logp, where), scores


def pi_sft_loss(logp: torch.Tensor, mask: torch.Tensor, group: int) -> torch.Tensor:
    """π SFT's loss over one optimizer step's examples (rows), the release's normalisation: the
    token mean of −log π over each group of ``group`` consecutive rows (its per-device batch of
    2: ``F.cross_entropy`` over a micro-batch's target tokens), averaged over the groups (its
    loss / grad_accum, 32 micro-batches). ``group`` 1 is a per-example token mean."""
    tokens = -(logp * mask).sum(dim=1)
    counts = mask.sum(dim=1)
    groups = [
        tokens[g : g + group].sum() / counts[g : g + group].sum().clamp(min=1)
        for g in range(0, logp.shape[0], group)
    ]
    return torch.stack(groups).mean()


def pi_sft_row_weights(counts: Sequence[int], group: int) -> list[float]:
    """Each row's weight in ``pi_sft_loss``: 1 / (its group's target tokens · the number of
    groups), so that the loss is Σ_rows weight · (−Σ_t log π) and any split of the rows into
    micro-batches sums to the whole batch's loss exactly. ``counts``: target tokens per row."""
    n_groups = -(-len(counts) // group)
    weights = []
    for g in range(0, len(counts), group):
        total = max(sum(counts[g : g + group]), 1)
        weights += [1.0 / (total * n_groups)] * len(counts[g : g + group])
    return weights


def pi_sft_batches(n: int, batch: int, rng: random.Random) -> list[list[int]]:
    """One epoch's optimizer steps over ``n`` examples: a fresh shuffle cut into full batches of
    ``batch``; the rest (< ``batch``, other examples each epoch) is left out, as the release's
    loop drops an epoch's incomplete accumulation (``zero_grad`` at every epoch's start). Fewer
    than ``batch`` examples in all: one step on all of them."""
    order = list(range(n))
    rng.shuffle(order)
    if n < batch:
        return [order] if order else []
    return [order[b * batch : (b + 1) * batch] for b in range(pi_steps_per_epoch(n, batch))]


def pi_steps_per_epoch(n: int, batch: int) -> int:
    """Optimizer steps of one π SFT epoch over ``n`` examples (``pi_sft_batches``)."""
    return 0 if n == 0 else max(1, n // batch)


def sft_policy(
    train: TrainEngine,
    trajs: Sequence[Trajectory],
    w: ArcoWarmupConfig,
    seed: int,
    select_fn,
    logger: MetricsLogger | None,
) -> dict:
    """π SFT (policy adapter) on the steps of ``trajs``, one example a step, ``warmup.pi_batch``
    examples an optimizer step on one cosine schedule, forwarded ``warmup.micro_batch_size`` at a
    time with the gradient accumulated (``pi_sft_row_weights``: the loss is ``pi_sft_loss`` of
    the whole batch exactly, whatever the split); after each epoch ``select_fn()`` gives
    held-out EM and the best SFT epoch's adapter is kept (epoch 0, the base, is measured and
    recorded but never kept: the release always keeps an SFT epoch; ties go to the earlier).
    ``w``: the ``warmup`` section; ``seed``: the run's."""
    rng = random.Random(seed)
    examples = step_examples(trajs)
    per_epoch = pi_steps_per_epoch(len(examples), w.pi_batch)
    total = per_epoch * w.pi_epochs
    pad = train.model.lm.config.pad_token_id or 0
    history = [{"epoch": 0, "select_em": select_fn()}]
    best: dict | None = None
    step = 0
    for epoch in range(1, w.pi_epochs + 1):
        losses, sizes = [], []
        batches = pi_sft_batches(len(examples), w.pi_batch, rng)
        bar = progress(batches, f"[arco warmup] π epoch {epoch}", unit="step")
        for chunk in bar:
            _set_lrs(
                train, {"policy": w.pi_lr}, _lr_factor(step, total, int(w.warmup_ratio * total))
            )
            views = [step_view(trajs[examples[k][0]], examples[k][1]) for k in chunk]
            weights = pi_sft_row_weights([sum(v.loss_mask) for v in views], w.pi_loss_group)
            loss = 0.0
            for a in range(0, len(views), w.micro_batch_size):  # accumulated: one step
                b = a + w.micro_batch_size
                batch = collate(views[a:b], pad).to(train.device)
                logp = target_logprobs(
                    train, "policy", batch.input_ids, batch.attention_mask, batch.loss_mask
                )[0]
                row_w = torch.tensor(weights[a:b], device=train.device)
                part = (row_w * -(logp * batch.loss_mask).sum(dim=1)).sum()
                train.backward(part)
                loss += part.item()
            train.step()
            losses.append(loss)
            sizes.append(len(chunk))
            step += 1
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        em = select_fn()
        row = {
            "epoch": epoch,
            "loss": sum(losses) / len(losses),
            "select_em": em,
            "optimizer_steps": len(sizes),
            "examples": sum(sizes),
        }
        if logger:
            logger.log(epoch, {f"pi_sft/{k}": v for k, v in row.items()})
        history.append({**row, "examples_per_step": sizes})
        print(
            f"[arco warmup] π epoch {epoch}: {len(sizes)} steps of {w.pi_batch} agent steps, "
            f"loss {row['loss']:.3f}, held-out EM {em:.3f}",
            flush=True,
        )
        if best is None or em > best["em"]:
            best = {"epoch": epoch, "em": em, "state": _adapter_state(train.model, "policy")}
    assert best is not None  # pi_epochs >= 1 here (0 skips π SFT before this)
    _load_adapter_state(train.model, best["state"])
    return {
        "chosen_epoch": best["epoch"],
        "chosen_select_em": best["em"],
        "base_select_em": history[0]["select_em"],
        "trajectories": len(trajs),
        "examples": len(examples),
        "steps_per_epoch": per_epoch,
        "epochs": history,
    }


def sft_rubric(
    train: TrainEngine,
    items: Sequence[RubricItem],
    w: ArcoWarmupConfig,
    seed: int,
    pad_id: int,
    logger: MetricsLogger | None,
) -> dict:
    """μ SFT: −tokenmean log μ(criteria JSON + EOS) + score_weight · MSE(head, projected scores),
    over ``warmup.mu_batch`` items an optimizer step, forwarded ``warmup.micro_batch_size`` at a
    time with the gradient accumulated (the token mean and the MSE over the whole batch).
    ``w``: the ``warmup`` section; ``seed``: the run's."""
    rng = random.Random(seed + 1)
    per_epoch = max(1, -(-len(items) // w.mu_batch))
    total = per_epoch * w.mu_epochs
    lrs = {"rubric": w.mu_lr, "head": w.head_lr}
    history = []
    step = 0
    for epoch in range(1, w.mu_epochs + 1):
        order = list(range(len(items)))
        rng.shuffle(order)
        ce, mse = [], []
        bar = progress(range(per_epoch), f"[arco warmup] μ epoch {epoch}", unit="step")
        for b in bar:
            chunk = [items[i] for i in order[b * w.mu_batch : (b + 1) * w.mu_batch]]
            _set_lrs(train, lrs, _lr_factor(step, total, int(w.warmup_ratio * total)))
            n_tokens = sum(len(it.criteria_ids) for it in chunk if it.written)
            n_scores = sum(len(it.target_scores) for it in chunk)
            parts = [0.0, 0.0]  # the batch's CE and MSE, summed over its micro-batches
            for a in range(0, len(chunk), w.micro_batch_size):  # accumulated: one step
                micro = chunk[a : a + w.micro_batch_size]
                ids, attn, crit = rubric_batch(micro, pad_id, train.device)
                logp, scores = target_logprobs(train, "rubric", ids, attn, crit, pool=True)
                target = torch.tensor([it.target_scores for it in micro], device=train.device)
                loss = rubric_sft_loss(
                    logp, crit, scores, target, w.score_weight, n_tokens, n_scores
                )
                train.backward(loss)
                with torch.no_grad():
                    parts[0] += (-(logp * crit).sum() / max(n_tokens, 1)).item()
                    parts[1] += (((scores.float() - target) ** 2).sum() / n_scores).item()
            train.step()
            ce.append(parts[0])
            mse.append(parts[1])
            step += 1
            bar.set_postfix(ce=f"{parts[0]:.3f}", refresh=False)
        row = {"epoch": epoch, "criteria_ce": float(np.mean(ce)), "score_mse": float(np.mean(mse))}
        history.append(row)
        if logger:
            logger.log(100 + epoch, {f"mu_sft/{k}": v for k, v in row.items()})
        print(
            f"[arco warmup] μ epoch {epoch}: criteria CE {row['criteria_ce']:.3f}, "
            f"score MSE {row['score_mse']:.4f}",
            flush=True,
        )
    return {"epochs": history}


def check_written_criteria(
    engine,
    items: Sequence[RubricItem],
    rubric: RubricConfig,
    w: ArcoWarmupConfig,
    eos_id: int,
    logger=None,
) -> dict:
    """What μ writes after SFT: greedy criteria for up to ``warmup.check_items`` of its SFT
    items (an even spread), the share that parses as exactly K criteria and the share equal to
    the teacher's. Training items, so this says whether μ learned the format, not whether it
    generalises."""
    n = min(len(items), w.check_items)
    if n == 0:
        return {"items": 0}
    picked = [items[round(i * (len(items) - 1) / max(1, n - 1))] for i in range(n)]
    probes = [replace(it, criteria_ids=[], criteria=None) for it in picked]
    invalid = write_criteria(engine, probes, rubric.k, rubric.max_new_tokens, eos_id)
    same = sum(p.criteria_ids == it.criteria_ids for p, it in zip(probes, picked, strict=True))
    row = {"items": n, "criteria_valid_rate": 1 - invalid / n, "teacher_match_rate": same / n}
    if logger:
        logger.log(200, {f"mu_writes/{k}": v for k, v in row.items()})
    print(
        f"[arco warmup] μ writes valid criteria for {row['criteria_valid_rate']:.0%} of {n} "
        f"SFT steps, the teacher's exactly for {row['teacher_match_rate']:.0%}",
        flush=True,
    )
    return row


def _adapter_state(model: ArcoModel, name: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if f".{name}." in n and "lora_" in n
    }


@torch.no_grad()
def _load_adapter_state(model: ArcoModel, state: dict[str, torch.Tensor]) -> None:
    params = dict(model.named_parameters())
    for n, t in state.items():
        params[n].copy_(t)


def _phase_state(train: TrainEngine) -> dict:
    """What a later phase starts from besides the phase's own result: every weight the warmup
    trains (π's and μ's adapters, the head: the optimizer's; on CPU) and the random streams, so
    a resumed warmup continues as an uninterrupted one would (a fresh process builds the
    untrained weights from its own RNG)."""
    ids = {id(p) for g in train.optimizer.param_groups for p in g["params"]}
    trained = {
        n: p.detach().cpu().clone() for n, p in train.model.named_parameters() if id(p) in ids
    }
    return {"trained": trained, "rng": rng_state()}


def teacher_cache(cfg: ArcoConfig) -> Path:
    """The LLM teacher's cache (one file per request, keyed by the sha256 of its endpoint, model,
    messages, sampling settings and tag): ``warmup.api_cache_dir`` (default ``runs/cache/llm``),
    shared by every warmup, so a rerun, a variant or another backbone on the same data replays
    the requests it shares with an earlier warmup instead of paying for them again. Set to '':
    the warmup's own ``teacher_cache``, or with ``warmup.policy_from`` that warmup's."""
    if cfg.warmup.api_cache_dir:
        return Path(cfg.warmup.api_cache_dir)
    return Path(cfg.warmup.policy_from or cfg.warmup_dir) / "teacher_cache"


PHASES = ("collect", "pi", "mu")
PHASE_NAMES = {"collect": "collection", "pi": "π", "mu": "μ"}
PI_LOG_STEPS = 100  # metrics.jsonl: π's epochs are logged at steps 1.., μ's at 100 + epoch
# keys the warmup does not read (RL's, where and how a run starts): changing them keeps its phases
NOT_WARMUP = frozenset(
    {"run_dir", "resume", "allow_config_change", "warmup_dir", "log", "rl", "diagnose", "steps"}
    | {"eval_every", "eval_questions", "save_every", "keep_checkpoints", "samples_per_step"}
)
NOT_WARMUP_TRAIN = frozenset(  # RL's optimizer keys and the derived ones (the warmup sets its own)
    {"lr", "grad_accum", "total_steps", "seed", "weight_decay", "max_grad_norm", "scheduler"}
)
# warmup keys that change what the teacher's answers cost or where they are kept, not what they
# are: a cap raised after a stop, or prices, keep the phases done
NOT_WARMUP_RESULT = frozenset(
    {"api_cache_dir", "max_api_calls", "max_api_usd", "player_usd_per_mtok"}
    | {"annotator_usd_per_mtok"}
)


def warmup_settings(cfg: ArcoConfig) -> str:
    """A hash of the settings the warmup depends on: the config less ``NOT_WARMUP`` (RL's keys,
    the output folders, logging), ``train``'s RL-only and derived keys and the API cost keys of
    ``warmup`` (``NOT_WARMUP_RESULT``)."""
    settings = {k: v for k, v in config_to_dict(cfg).items() if k not in NOT_WARMUP}
    train = settings.get("train", {})
    settings["train"] = {k: v for k, v in train.items() if k not in NOT_WARMUP_TRAIN}
    warm = settings.get("warmup", {})
    settings["warmup"] = {k: v for k, v in warm.items() if k not in NOT_WARMUP_RESULT}
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# what a phase's result may hold besides plain data (``common.train.plain_state``)
PHASE_CLASSES = (Trajectory, Step, Doc, Episode, AgentStep, StepAnnotation)


class WarmupPhases:
    """``warmup_dir/phases/``: each finished phase's result (``<phase>.json`` and
    ``<phase>.safetensors``) and marker (``<phase>.done``, JSON: the settings hash, the RL
    settings and the result's path), written atomically after the result. ``done`` are the
    leading phases whose markers hold this config's hash."""

    def __init__(self, out: Path, settings: str, rl_settings: dict | None = None):
        self.out, self.dir, self.settings = out, out / "phases", settings
        self.rl_settings = rl_settings
        self.done: list[str] = []
        stale = []
        for name in PHASES:
            marker = self.dir / f"{name}.done"
            try:
                record = json.loads(marker.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                break
            if not isinstance(record, dict) or record.get("settings") != settings:
                stale.append(name)
                break
            if name == "mu" and not (self.out / "arco.json").exists():
                break
            if name != "mu" and not _plain_exists(self.result(name)):
                if (self.dir / f"{name}.pt").exists():
                    print(
                        f"[arco warmup] {self.dir / name}.pt: an older warmup's pickle, not "
                        f"read (a pickle runs code when read); the {PHASE_NAMES[name]} phase "
                        "runs again",
                        flush=True,
                    )
                break
            self.done.append(name)
        if stale:
            print(
                f"[arco warmup] {self.dir}: other settings than the {PHASE_NAMES[stale[0]]} "
                "phase was done with; every phase from it runs again",
                flush=True,
            )
        for name in PHASES[len(self.done) :]:  # a later phase built on one that runs again
            (self.dir / f"{name}.done").unlink(missing_ok=True)

    def result(self, name: str) -> Path:
        """μ's result: the folder; the others': the stem of their plain files."""
        return self.out if name == "mu" else self.dir / name

    def shown(self, name: str) -> Path:
        return self.out if name == "mu" else self.dir / f"{name}.json"

    def skip(self, name: str) -> Any:
        """Say the phase is skipped; its saved result (None for μ: the folder is its result)."""
        print(
            f"[arco warmup] {PHASE_NAMES[name]} phase done at {self.shown(name)}, skipped",
            flush=True,
        )
        if name == "mu":
            return None
        return load_plain(self.result(name), PHASE_CLASSES)

    def finish(self, name: str, result: Any = None) -> None:
        """The phase's result (μ: none, its files are written), then its marker."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if name != "mu":
            save_plain(self.result(name), result, PHASE_CLASSES)
            (self.dir / f"{name}.pt").unlink(missing_ok=True)  # an older warmup's pickle
        record = {"phase": name, "settings": self.settings, "output": str(self.shown(name))}
        if self.rl_settings is not None:
            record["rl_settings"] = self.rl_settings
        write_atomic(self.dir / f"{name}.done", json.dumps(record) + "\n")

    def skip_all(self) -> None:
        """Every phase done: each said skipped; a μ marker written before markers held the RL
        settings gets them (rank 0)."""
        for name in PHASES:
            self.skip(name)
        marker = json.loads((self.dir / "mu.done").read_text(encoding="utf-8"))
        if "rl_settings" not in marker and current_rank() == 0:
            self.finish("mu")


@dataclass
class WarmupParts:
    """What the phases run on, built once the services answered (``build_parts``): the tokenizer,
    the model with both adapters and the head, its training engine, the metrics logger (main
    rank), the environment and the rollout engine."""

    tokenizer: Any
    model: ArcoModel
    train: TrainEngine
    logger: MetricsLogger | None
    retriever: Any
    agent_cfg: AgentConfig
    engine: Any


def run_warmup(cfg: ArcoConfig) -> Path:
    """The whole warmup, by phase (the module docstring); returns ``warmup_dir``."""
    cfg.check_assets(("model", "train", "retrieval", "teacher"))
    out = Path(cfg.warmup_dir)
    played, select, imported = warmup_questions(cfg)
    # Locked, no settings check (the phases' markers hold the settings they were done with);
    # phases done under these settings are skipped, the log keeps their rows (π's).
    folder = open_run_folder(out, None, resume=False, begin=False)
    phases = WarmupPhases(out, warmup_settings(cfg), warmup_rl_settings(cfg))
    if "mu" in phases.done:  # all of it done: nothing loads
        phases.skip_all()
        folder.close()
        return out
    if "collect" not in phases.done:
        probe_services(cfg)
    folder.start_step = PI_LOG_STEPS if "pi" in phases.done else 0
    folder.begin()
    parts = build_parts(cfg, out, folder.start_step)
    collected = collect_phase(cfg, parts, phases, played, imported)
    episodes, annotations = collected["episodes"], collected["annotations"]
    pi_idx, mu_idx, filtered = sft_sets(episodes, annotations, cfg.warmup, collected["collect_s"])
    write_jsonl_atomic(out / "data.jsonl", data_rows(episodes, annotations))
    report = {
        "counts": collected["counts"],
        "filter": filtered,
        "collect_s": collected["collect_s"],
    }
    trajs = collected["trajs"]
    report["pi_sft"] = pi_phase(cfg, parts, phases, [trajs[i] for i in pi_idx], select)
    mu_annotations = [annotations[i] for i in mu_idx]
    report |= mu_phase(cfg, parts, [episodes[i] for i in mu_idx], mu_annotations)
    if parts.train.is_main:
        save_arco(parts.model, out)
        write_atomic(out / "report.json", json.dumps(report, indent=1, default=str))
        phases.finish("mu")
    if parts.logger:
        parts.logger.close()
    folder.close()
    return out


def warmup_questions(
    cfg: ArcoConfig,
) -> tuple[list[QAExample], list[QAExample], ReleaseImport | None]:
    """The training questions the teacher plays and those π's epoch is chosen on (a seeded
    shuffle, disjoint), and with ``warmup.teacher=file`` the release's data, imported now (a
    malformed file stops the warmup before a model loads; nothing is played, and the choice is
    made on questions the release never played). Too few questions: a ``ValueError``."""
    w = cfg.warmup
    train_set = cfg.assets.questions("train", cfg.question_chars())
    order = list(range(len(train_set)))
    random.Random(cfg.seed).shuffle(order)
    if w.teacher == "file":
        imported = import_release(
            w.release_file, train_set, cfg.rubric.k, cfg.env.max_searches, w.questions, w.samples
        )
        if not imported.episodes:
            raise ValueError(f"warmup.release_file {w.release_file}: no record imported")
        order = [i for i in order if train_set[i].id not in imported.question_ids]
        if len(order) < w.select_questions:
            raise ValueError(
                f"warmup needs select_questions = {w.select_questions} training questions "
                f"outside {w.release_file}; {cfg.assets.train} has {len(order)}"
            )
        return [], [train_set[i] for i in order[: w.select_questions]], imported
    if len(order) < w.questions + w.select_questions:
        kept = cfg.assets.train_where
        raise ValueError(
            f"warmup needs questions + select_questions = {w.questions + w.select_questions} "
            f"training questions; {cfg.assets.train} has {len(order)}"
            + (f" kept by assets.train_where {kept}" if kept else "")
        )
    played = [train_set[i] for i in order[: w.questions]]
    select = [train_set[i] for i in order[w.questions : w.questions + w.select_questions]]
    return played, select, None


def probe_services(cfg: ArcoConfig) -> None:
    """Before any model loads, the services the collection needs answer: the LLM teacher's
    player and annotator (each serving its model), an open setting's retrieval server."""
    if cfg.warmup.teacher == "llm":
        for client in teacher_clients(cfg, teacher_cache(cfg)):
            client.probe()
    if cfg.env.setting == "open":
        probe_retrieval(cfg.assets.retrieval_url)


def build_parts(cfg: ArcoConfig, out: Path, start_step: int) -> WarmupParts:
    """The tokenizer, the model (adapters and head created under ``seed``), the warmup's training
    engine (its own optimizer keys, ``warmup_train_config``), the logger from ``start_step``, the
    environment and the rollout engine with both adapters pushed."""
    from transformers import AutoTokenizer, set_seed

    from arco.trainer import push_adapters, rubric_settings

    tokenizer = AutoTokenizer.from_pretrained(cfg.assets.model)
    set_seed(cfg.seed)  # the fresh adapters and head: this seed's, not the process's
    model = build_arco_model(
        cfg.assets.model, cfg.lora.as_peft(), cfg.head_k, dtype=cfg.train.weights_dtype()
    )
    model.rubric_meta = rubric_settings(cfg)
    w = cfg.warmup
    lrs = {"policy": w.pi_lr, "rubric": w.mu_lr, "head": w.head_lr}
    train = TrainEngine(
        model, warmup_train_config(cfg.train, cfg.warmup, cfg.seed), param_groups=model.groups(lrs)
    )
    logger = None
    if train.is_main:
        logger = MetricsLogger.from_config(out, cfg.log, cfg, start_step=start_step)
    a = cfg.assets
    retriever, agent_cfg = build_environment(
        cfg.env, cfg.agent, a.corpus, a.retrieval_url, a.retrieval_max_wait_s
    )
    engine = build_engine(
        cfg.engine, a.model, model.lm, tokenizer, cfg.seed + train.rank, cfg.lora.r
    )
    push_adapters(engine, model)
    return WarmupParts(tokenizer, model, train, logger, retriever, agent_cfg, engine)


def warmup_train_config(train: TrainConfig, w: ArcoWarmupConfig, seed: int) -> TrainConfig:
    """The warmup's optimizer settings: ``train.weight_decay``, ``max_grad_norm`` and the
    schedule are RL's keys, the warmup's own are under ``warmup`` (``w``); a copy, so the run's
    config keeps what the user set (``train.seed``, set here to the run's ``seed``; ``lr`` and
    ``grad_accum``: ``ArcoConfig.DERIVED``)."""
    train.seed = seed
    return replace(
        train,
        lr=w.pi_lr,
        weight_decay=w.weight_decay,
        max_grad_norm=w.max_grad_norm,
        scheduler="constant",
        grad_accum=1,
    )


def collect_phase(
    cfg: ArcoConfig,
    parts: WarmupParts,
    phases: WarmupPhases,
    played: Sequence[QAExample],
    imported: ReleaseImport | None,
) -> dict:
    """The collection: its saved result (the fresh adapters and head and the random streams
    restored as it left them), or the teacher's play and annotations (oracle, the release's file,
    or an LLM's paid requests: rank 0 sends them, every rank gets the result), saved with the
    phase (main rank) before the annotations are projected in place. Keys ``trajs``,
    ``episodes``, ``annotations``, ``counts``, ``collect_s``."""
    if "collect" in phases.done:
        collected = phases.skip("collect")
        _load_adapter_state(parts.model, collected.pop("trained"))
        set_rng_state(collected.pop("rng"))
        return collected
    t0 = time.perf_counter()
    tokenizer, agent_cfg = parts.tokenizer, parts.agent_cfg
    if cfg.warmup.teacher == "oracle":
        got = collect_oracle(cfg, parts.engine, tokenizer, parts.retriever, agent_cfg, played)
    elif imported is not None:  # warmup.teacher=file: no request
        got = collect_release(tokenizer, agent_cfg, imported)
    else:
        cache = teacher_cache(cfg)
        got = on_rank_zero(
            lambda: collect_llm(cfg, tokenizer, parts.retriever, agent_cfg, played, cache)
        )
    collected = dict(zip(("trajs", "episodes", "annotations", "counts"), got, strict=True))
    collected["collect_s"] = time.perf_counter() - t0
    if parts.train.is_main:
        phases.finish("collect", {**collected, **_phase_state(parts.train)})
    return collected


def sft_sets(
    episodes: Sequence[Episode],
    annotations: Sequence[list[StepAnnotation] | None],
    w: ArcoWarmupConfig,
    collect_s: float,
) -> tuple[list[int], list[int], dict[str, int]]:
    """``project_and_filter``'s π and μ indices and counts, said in a line; no μ example: a
    ``ValueError``."""
    pi_idx, mu_idx, counts = project_and_filter(episodes, annotations, w.decomposition_tol)
    mean_r = np.mean([e.reward for e in episodes]) if episodes else 0
    print(
        f"[arco warmup] {len(episodes)} trajectories ({collect_s:.0f}s), mean R {mean_r:.3f}; "
        f"π SFT on {len(pi_idx)}, μ SFT on {len(mu_idx)}; {counts}",
        flush=True,
    )
    if not mu_idx:
        raise ValueError(
            f"warmup: no trajectory with more than one step and a kept annotation for μ "
            f"({counts}); play more questions or samples"
        )
    return pi_idx, mu_idx, counts


def data_rows(
    episodes: Sequence[Episode], annotations: Sequence[list[StepAnnotation] | None]
) -> list[dict]:
    """``data.jsonl``'s rows: each episode with its (projected) annotation, None where dropped."""
    return [
        {**asdict(ep), "annotation": None if ann is None else [asdict(a) for a in ann]}
        for ep, ann in zip(episodes, annotations, strict=True)
    ]


def pi_phase(
    cfg: ArcoConfig,
    parts: WarmupParts,
    phases: WarmupPhases,
    trajs: Sequence[Trajectory],
    select: Sequence[QAExample],
) -> dict:
    """π's phase; its report. Its saved result (π's adapter, μ's and the head untrained, the
    random streams), π taken from ``warmup.policy_from`` (one π for every arm of a comparison),
    none (``warmup.pi_epochs`` 0: π is the backbone; or no trajectory with R = 1 and > 1 step),
    or π SFT on ``trajs``, its epoch chosen on ``select``; saved with the phase (main rank)."""
    w = cfg.warmup
    if "pi" in phases.done:
        saved = phases.skip("pi")
        _load_adapter_state(parts.model, saved["trained"])
        set_rng_state(saved["rng"])
        return saved["report"]
    if w.policy_from:
        load_adapters(parts.model.lm, w.policy_from, ["policy"])
        report: dict = {"policy_from": w.policy_from}
        print(f"[arco warmup] π taken from {w.policy_from} (no π SFT)", flush=True)
    elif w.pi_epochs == 0:  # the tiny setting: π SFT on the oracle's play would do RL's work
        report = {"skipped": "warmup.pi_epochs = 0", "select_em": held_out_em(cfg, parts, select)}
        print("[arco warmup] π SFT skipped (warmup.pi_epochs = 0): π is the backbone", flush=True)
    elif trajs:
        nap(cfg.engine, parts.engine)
        report = sft_policy(
            parts.train,
            trajs,
            w,
            cfg.seed,
            lambda: held_out_em(cfg, parts, select),
            parts.logger,
        )
    else:  # e.g. an untrained agent that never answers right: π stays as it is
        report = {"skipped": "no trajectory with R = 1 and more than one step"}
        print("[arco warmup] π SFT skipped: no trajectory with R = 1 and > 1 step", flush=True)
    if parts.train.is_main:
        phases.finish("pi", {"report": report, **_phase_state(parts.train)})
    return report


def held_out_em(cfg: ArcoConfig, parts: WarmupParts, select: Sequence[QAExample]) -> float:
    """π's EM on the held-out training questions (the adapters pushed, the engine woken; asleep
    again after, for SFT)."""
    from arco.trainer import push_adapters

    push_adapters(parts.engine, parts.model)
    em = evaluate(
        parts.engine, parts.tokenizer, parts.retriever, select, parts.agent_cfg, adapter="policy"
    )["em"]
    nap(cfg.engine, parts.engine)
    return em


def mu_phase(
    cfg: ArcoConfig,
    parts: WarmupParts,
    episodes: Sequence[Episode],
    annotations: Sequence[list[StepAnnotation]],
) -> dict:
    """μ SFT on the steps of ``episodes`` (their projected ``annotations``: the criteria μ learns
    to write in mode adaptive, the head's targets), the reference adapters synced, and in mode
    adaptive what μ writes after it; the report's ``mu_sft`` (and ``mu_writes``)."""
    from arco.trainer import make_rubric_items, push_adapters

    eos_id = parts.tokenizer.eos_token_id
    items = make_rubric_items(cfg, episodes, parts.tokenizer)
    for it in items:
        ann = annotations[it.traj][it.step]
        if it.written:  # mode adaptive: μ learns to write the teacher's criteria
            criteria = encode_text(parts.tokenizer, format_criteria(ann.criteria))
            it.criteria_ids = criteria + [eos_id]
        it.target_scores = sft_targets(ann.scores, cfg.head_k)
    nap(cfg.engine, parts.engine)
    pad_id = padding_id(parts.tokenizer)
    report = {"mu_sft": sft_rubric(parts.train, items, cfg.warmup, cfg.seed, pad_id, parts.logger)}
    parts.model.sync_references()
    if cfg.rubric_mode == "adaptive":
        push_adapters(parts.engine, parts.model)
        report["mu_writes"] = check_written_criteria(
            parts.engine, items, cfg.rubric, cfg.warmup, eos_id, parts.logger
        )
    return report


def nap(engine_cfg: EngineConfig, engine) -> None:
    """A vLLM engine put to sleep through SFT (``engine.sleep_during_update``), unless asleep;
    ``push_adapters`` wakes it. An HF engine is the training model: nothing to do."""
    sleeps = engine_cfg.backend == "vllm" and engine_cfg.sleep_during_update
    if sleeps and not engine.asleep:
        engine.sleep()
