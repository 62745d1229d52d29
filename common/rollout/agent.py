"""The multi-turn search agent loop (specs/search_agent.md), batched over questions x samples.

Each turn: generate for every live trajectory at once, parse the actions, send all of the turn's
queries to the retriever in one call, insert the observations as token ids, repeat; after
``max_turns`` turns one last turn is generated with searching disabled to force an answer.
With ``state_budget`` the inserted text states the searches left before every free turn (in the
first prompt and inside each observation, between its body and its frame's tail), as the ARCO
release's ``turn.txt`` does; the forced turn gets the forced-answer message instead.
A retriever with ``search_for`` (``PerQuestionRetriever``) ranks only each question's own
paragraphs: the turn's queries go to it in one call per question.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from common.data import QAExample
from common.metrics import normalize_answer
from common.retrieval.base import Doc, Retriever
from common.rollout.engine import Completion, GenerationEngine, SamplingConfig, mix_seed
from common.rollout.protocols import BUDGET_STATEMENT, get_protocol
from common.rollout.trajectory import Step, Trajectory

INVALID_EOS = ("continue", "end")


@dataclass
class AgentConfig:
    """How the search agent runs."""

    protocol: Literal["search_r1", "react"] = field(
        default="search_r1", metadata={"help": "search_r1 | react"}
    )
    instruction: str = field(
        default="", metadata={"help": "user prompt with {question}; empty = the protocol's own"}
    )
    max_turns: int = field(
        default=4, metadata={"help": "turns before the forced-answer turn", "ge": 0}
    )
    topk: int = field(default=3, metadata={"help": "documents shown per search", "ge": 1})
    max_turn_tokens: int = field(default=500, metadata={"help": "new tokens per turn", "ge": 1})
    max_obs_tokens: int = field(default=500, metadata={"help": "tokens per observation", "ge": 0})
    obs_titles: bool = field(
        default=True, metadata={"help": "show document titles in observations (ARCO: false)"}
    )
    max_context: int = field(
        default=4096, metadata={"help": "prompt + response token limit", "ge": 1}
    )
    max_response_tokens: int = field(
        default=0,
        metadata={
            "help": "response (turns + inserted text) token limit; 0 = max_context only",
            "ge": 0,
        },
    )
    invalid_eos: Literal["continue", "end"] = field(
        default="continue",
        metadata={
            "help": "a turn without an action that ends its message: continue (corrective "
            "message, as the spec and Search-R1) | end (forced-terminated)"
        },
    )
    state_budget: bool = field(
        default=False,
        metadata={
            "help": "state the searches remaining before every free turn, in the first prompt "
            "and after each observation (the ARCO release's turn.txt)"
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "ge": 0})
    top_p: float = field(default=1.0, metadata={"help": "nucleus mass", "gt": 0, "le": 1})
    top_k: int = field(default=0, metadata={"help": "0 = off", "ge": 0})


def build_prompt_ids(
    tokenizer, protocol, question: str, instruction: str = "", budget: int | None = None
) -> list[int]:
    """The chat-templated user turn plus the assistant header, as token ids. ``budget`` (the
    searches before the forced turn; None: not stated) ends the user turn with the budget
    statement, on a line of its own."""
    content = instruction.format(question=question.strip()) if instruction else None
    content = content or protocol.user_prompt(question)
    if budget is not None:
        content += ("" if content.endswith("\n") else "\n") + BUDGET_STATEMENT.format(n=budget)
    messages = [{"role": "user", "content": content}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def encode_text(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def _any_alive_globally(alive: bool) -> bool:
    """Whether any rank has a live trajectory: the ranks take their turns together, so an engine
    whose calls are collective (a ZeRO-3 model's gathers) is called as often on every rank."""
    from common.train.distributed import all_reduce_values  # torch: loaded when the agent runs

    return bool(all_reduce_values([1 if alive else 0], op="max")[0])


def run_agent(
    engine: GenerationEngine,
    tokenizer,
    retriever: Retriever,
    examples: Sequence[QAExample],
    n: int,
    cfg: AgentConfig,
    group_prefix: str = "",
    adapter: str | None = None,
    seed: int | None = None,
    timings: dict[str, float] | None = None,
    on_group_done: Callable[[list[Trajectory]], None] | None = None,
) -> list[Trajectory]:
    """Roll out ``n`` trajectories per example; returns them grouped, question-major.

    ``group_id`` = ``f"{group_prefix}{position}:{example.id}"``, unique per question instance
    even when one question appears twice in a batch or ids repeat across sources.
    ``timings`` (optional) accumulates seconds spent in ``generation`` and ``retrieval``.
    ``on_group_done`` (optional) is called with a question's ``n`` trajectories as soon as all
    of them are done, while the other questions still roll out (once per question, in the order
    they finish; all remaining ones before returning).
    """
    from common.train.distributed import current_rank, is_multi_rank  # torch, when it runs

    timings = timings if timings is not None else {}
    protocol = get_protocol(cfg.protocol)
    if cfg.invalid_eos not in INVALID_EOS:
        raise ValueError(f"agent.invalid_eos must be one of {INVALID_EOS}, got {cfg.invalid_eos!r}")
    trajs: list[Trajectory] = []
    for pos, ex in enumerate(examples):
        prompt = build_prompt_ids(
            tokenizer, protocol, ex.question, cfg.instruction, first_budget(cfg)
        )
        for k in range(n):
            trajs.append(
                Trajectory(
                    group_id=f"{group_prefix}{pos}:{ex.id}",
                    sample_index=k,
                    question_id=ex.id,
                    question=ex.question,
                    golden_answers=list(ex.golden_answers),
                    prompt_ids=prompt,
                )
            )
    rank = current_rank()
    invalid_ids = encode_text(tokenizer, protocol.invalid_message())
    force_ids = encode_text(tokenizer, protocol.force_answer_message())
    seen_queries: dict[int, set[str]] = {i: set() for i in range(len(trajs))}
    pending = list(range(len(examples)))  # questions not yet passed to on_group_done

    def report_finished(last: bool = False) -> None:
        nonlocal pending
        if on_group_done is None:
            return
        finished = [p for p in pending if last or all(t.done for t in trajs[p * n : (p + 1) * n])]
        for pos in finished:
            on_group_done(trajs[pos * n : (pos + 1) * n])
        pending = [p for p in pending if p not in finished]

    for turn in range(cfg.max_turns + 1):
        report_finished()
        live = [i for i, t in enumerate(trajs) if not t.done]
        if not _any_alive_globally(bool(live)):
            break
        final_turn = turn == cfg.max_turns
        # a trajectory whose next observation would overflow the context answers now
        for i in live:
            t = trajs[i]
            room = cfg.max_context - len(t.input_ids)
            if cfg.max_response_tokens > 0:
                room = min(room, cfg.max_response_tokens - len(t.response_ids))
            room -= cfg.max_turn_tokens + cfg.max_obs_tokens
            if (final_turn or room < 0) and not t.used_forced_turn:
                t.used_forced_turn = True
                t.append(force_ids, sampled=False)
        forced = [i for i in live if trajs[i].used_forced_turn]
        free = [i for i in live if not trajs[i].used_forced_turn]
        queries: list[tuple[int, str]] = []
        note = budget_note(protocol, cfg, turn)
        turn_invalid_ids = invalid_ids
        if note:
            head, body, tail = protocol.invalid_observation()
            turn_invalid_ids = encode_text(tokenizer, head + body + note + tail)
        for batch, stop in ((free, protocol.stop), (forced, protocol.answer_stop)):
            if not batch and not is_multi_rank():
                continue
            params = SamplingConfig(
                n=1,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                max_tokens=cfg.max_turn_tokens,
                stop=list(stop),
                # one seed per trajectory and turn (and rank): GPU vLLM samples a request from
                # its seed, and a group's n requests share one prompt, so one seed for them all
                # would give n identical rollouts and zero advantages
                seed=None if seed is None else mix_seed(seed, rank, turn),
                prompt_seeds=None
                if seed is None
                else [mix_seed(seed, rank, i, turn) for i in batch],
            )
            t0 = time.perf_counter()
            prompts = [trajs[i].input_ids for i in batch]
            comps = _generate_turns(engine, tokenizer, protocol, prompts, params, adapter)
            timings["generation"] = timings.get("generation", 0.0) + time.perf_counter() - t0
            for i, comp in zip(batch, comps, strict=True):
                q = _take_turn(trajs[i], comp, protocol, tokenizer, turn_invalid_ids, cfg)
                if q is not None:
                    queries.append((i, q))
        if queries:
            t0 = time.perf_counter()
            results = _search(retriever, examples, [(i // n, q) for i, q in queries], cfg.topk)
            timings["retrieval"] = timings.get("retrieval", 0.0) + time.perf_counter() - t0
            for (i, q), docs in zip(queries, results, strict=True):
                t = trajs[i]
                t.num_searches += 1
                key = normalize_answer(q)
                t.num_duplicate_queries += key in seen_queries[i]
                seen_queries[i].add(key)
                t.steps[-1].docs = list(docs)
                obs, seen, text = render_observation(
                    tokenizer, protocol, docs, cfg.max_obs_tokens, cfg.obs_titles, note
                )
                t.steps[-1].seen = seen
                t.steps[-1].observation = text
                t.append(obs, False)
    report_finished(last=True)
    return trajs


def first_budget(cfg: AgentConfig) -> int | None:
    """The budget the first prompt states: ``max_turns`` under ``state_budget`` (None when off,
    or when the first turn is already the forced one)."""
    return cfg.max_turns if cfg.state_budget and cfg.max_turns > 0 else None


def budget_note(protocol, cfg: AgentConfig, turn: int) -> str:
    """The budget statement inserted after turn ``turn`` (0-based) when a free turn follows:
    ``max_turns - turn - 1`` searches left; "" when off or when the forced turn comes next."""
    left = cfg.max_turns - turn - 1
    return protocol.budget_message(left) if cfg.state_budget and left > 0 else ""


def _generate_turns(
    engine, tokenizer, protocol, prompts: list[list[int]], params: SamplingConfig, adapter
) -> list[Completion]:
    """One completion per prompt. A completion the protocol calls unfinished (ReAct: stopped on
    a ``]`` inside the action's argument) is resumed where it stopped, within the turn's token
    limit; the parts join into one sampled turn."""
    comps = [out[0] for out in engine.generate(prompts, params, adapter=adapter)]
    while True:
        todo = [
            j
            for j, c in enumerate(comps)
            if c.finish_reason == "stop"
            and len(c.token_ids) < params.max_tokens
            and protocol.unfinished(c.text)
        ]
        if not _any_alive_globally(bool(todo)):
            return comps
        # one call for all, on every rank while any rank resumes; each row is cut to its room
        room = max((params.max_tokens - len(comps[j].token_ids) for j in todo), default=1)
        more = engine.generate(
            [prompts[j] + comps[j].token_ids for j in todo],
            replace(
                params,
                max_tokens=room,
                prompt_seeds=None
                if params.prompt_seeds is None
                else [params.prompt_seeds[j] for j in todo],
            ),
            adapter=adapter,
        )
        for j, (extra,) in zip(todo, more, strict=True):
            ids = comps[j].token_ids + extra.token_ids
            over = len(ids) > params.max_tokens
            ids = ids[: params.max_tokens]
            comps[j] = Completion(
                ids,
                (comps[j].logprobs + extra.logprobs)[: len(ids)],
                tokenizer.decode(ids, skip_special_tokens=False),
                "length" if over else extra.finish_reason,
            )


def _search(
    retriever, examples: Sequence[QAExample], queries: list[tuple[int, str]], k: int
) -> list[list[Doc]]:
    """Top-k docs per (example position, query). A retriever with ``search_for`` gets each
    example's queries in one call, with its ``metadata["paragraphs"]`` when present, else its id."""
    if not hasattr(retriever, "search_for"):
        return retriever.search([q for _, q in queries], k)
    groups: dict[int, list[int]] = defaultdict(list)
    for j, (pos, _) in enumerate(queries):
        groups[pos].append(j)
    out: list[list[Doc]] = [[] for _ in queries]
    for pos, js in groups.items():
        ex = examples[pos]
        results = retriever.search_for(
            ex.metadata.get("paragraphs", ex.id), [queries[j][1] for j in js], k
        )
        for j, docs in zip(js, results, strict=True):
            out[j] = docs
    return out


def _take_turn(t: Trajectory, comp, protocol, tokenizer, invalid_ids, cfg) -> str | None:
    """Append one sampled turn; returns the query to run, if the turn searched."""
    start = len(t.response_ids)
    t.append(comp.token_ids, sampled=True, logprobs=comp.logprobs)
    text = tokenizer.decode(comp.token_ids, skip_special_tokens=False)
    action = protocol.parse(text)
    if t.used_forced_turn and action.kind == "search":
        action = type(action)("invalid")
    step = Step(
        action.kind,
        start,
        len(t.response_ids),
        query=action.query,
        logprobs=list(comp.logprobs),
        forced=t.used_forced_turn,
    )
    t.steps.append(step)
    if action.kind == "answer":
        t.answer, t.done = action.answer, True
        return None
    if action.kind == "search":
        return action.query
    t.num_invalid += 1
    ended = comp.finish_reason == "stop" and not any(s in text for s in protocol.stop)
    if t.used_forced_turn or (ended and cfg.invalid_eos == "end"):
        # no answer after the forced turn, or (invalid_eos=end) the message ended without one
        t.done, t.forced_terminated = True, True
    else:
        t.append(invalid_ids, sampled=False)
        step.observation = protocol.invalid_observation()[1]
    return None


def observation_ids(tokenizer, protocol, docs, max_tokens: int, titles: bool = True) -> list[int]:
    """Observation ids with the body cut to ``max_tokens`` minus the frame."""
    return observation(tokenizer, protocol, docs, max_tokens, titles)[0]


def observation(
    tokenizer, protocol, docs: Sequence[Doc], max_tokens: int, titles: bool = True, note: str = ""
) -> tuple[list[int], list[Doc]]:
    """Observation ids with the body cut to ``max_tokens`` minus the frame, and the documents the
    model saw: those shown whole, then the one the cut fell in with its text cut to what was
    shown (only if some of its text was; a document whose header alone shows is not seen)."""
    return render_observation(tokenizer, protocol, docs, max_tokens, titles, note)[:2]


def render_observation(
    tokenizer, protocol, docs: Sequence[Doc], max_tokens: int, titles: bool = True, note: str = ""
) -> tuple[list[int], list[Doc], str]:
    """``observation``'s ids and documents seen, and the body's text as shown (the documents
    alone: no frame, no ``note``). ``note`` (the budget statement) goes between the body and the
    tail and counts against ``max_tokens``."""
    head, body, tail = protocol.observation(list(docs), titles)
    head_ids, tail_ids = encode_text(tokenizer, head), encode_text(tokenizer, tail)
    note_ids = encode_text(tokenizer, note)
    room = max(max_tokens - len(head_ids) - len(note_ids) - len(tail_ids), 0)
    body_ids = encode_text(tokenizer, body)
    ids = head_ids + body_ids[:room] + note_ids + tail_ids
    if len(body_ids) <= room:
        return ids, list(docs), body
    text = tokenizer.decode(body_ids[:room], skip_special_tokens=False).rstrip("\ufffd")
    shown = len(text)
    seen: list[Doc] = []
    start = 0  # where document k's block starts in the body
    for k, doc in enumerate(docs):
        end = len(protocol.observation(list(docs[: k + 1]), titles)[1])
        if end <= shown:
            seen.append(doc)
            start = end
            continue
        block = body[start:end]
        at = block.find(doc.text) if doc.text else len(block)
        if shown - start > at >= 0:
            seen.append(doc._replace(text=doc.text[: shown - start - at]))
        break
    return ids, seen, text
