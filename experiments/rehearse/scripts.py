"""What a rehearsal's stand-in says: per method, the texts its scripted chain mixes.

A random model never searches and never boxes an answer, so no teacher is called, CER scores
nothing and every advantage is 0. The stand-in instead walks a token-level chain (see
``standin.chain_from_paths``) whose paths are these texts, each starting from the last token of
a generation prompt or of an inserted observation: valid searches, answers right and wrong
(from the stand-in data's answer set) and malformed turns, so every path of a trainer runs.
Paths share tokens (``<``, ``</``, ``]``), so the walk also mixes them into other malformed
turns: a rehearsal wants that too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.rollout.protocols import get_protocol

# (text, weight, where): the continuation of a generation prompt ("prompt"), of an inserted
# observation ("observation") or of either ("any")
Script = list[tuple[str, float, str]]


def search_r1_script(answers: Sequence[str]) -> Script:
    """EviBack's Search-R1 turns: a search first, an answer after an observation (the greedy
    walk: both valid), and with less weight the other, each of ``answers`` and a turn with none.

    The search's tags are written so that no token of it follows a different token in the
    answer (``>\\n`` opens the query, `` </`` closes it; the answer's ``>`` and ``</``), so the
    greedy walk cannot mix them; sampled walks still can, at the shared start tokens.
    """
    search = "<search>\nFrance capital </search>\n"
    return [
        (search, 3.0, "prompt"),
        (search, 1.0, "observation"),
        *[
            (f" <answer>{a}</answer>", w, "observation")
            for a, w in zip(answers, (2.0, 1.0), strict=False)
        ],
        *[(f" <answer>{a}</answer>", 0.5, "prompt") for a in answers],
        (" I am not sure.", 0.5, "any"),
    ]


def react_script(answers: Sequence[str], k: int) -> Script:
    """ARCO's ReAct turns (search first, finish after an observation) and μ's criteria as JSON
    with ``k`` items. μ's prompt ends as π's does (the chat template's assistant header), so the
    greedy criteria are π's search: invalid, counted and scored as written; sampled walks mix."""
    criteria = ", ".join(f'"criterion {i}"' for i in range(1, k + 1))
    return [
        (" Search[Paris]", 3.0, "prompt"),
        (" Search[Paris]", 1.0, "observation"),
        *[(f" Finish[{a}]", w, "observation") for a, w in zip(answers, (2.0, 1.0), strict=False)],
        (f" Finish[{answers[0]}]", 0.5, "prompt"),
        (" I am not sure.", 0.5, "any"),
        (f' {{"criteria": [{criteria}]}}', 1.0, "prompt"),
    ]


def math_script(answers: Sequence[str]) -> Script:
    """CER's solutions: a boxed answer from ``answers`` (right or wrong), a letter, none."""
    return [
        *[(f" The answer is $\\boxed{{{a}}}$.", 1.0, "prompt") for a in answers],
        (" The answer is $\\boxed{A}$.", 0.5, "prompt"),
        (" I do not know.", 0.5, "prompt"),
    ]


def start_tokens(tokenizer: Any, protocol: str | None) -> dict[str, list[int]]:
    """The last token of each text the model continues from, by kind: the generation prompt
    (thinking on and off) and, for an agent protocol, the tails of its inserted observations."""
    messages = [{"role": "user", "content": "Question?"}]
    starts: dict[str, list[int]] = {"prompt": [], "observation": []}
    for kwargs in ({}, {"enable_thinking": False}):
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, **kwargs
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        starts["prompt"].append(list(ids)[-1])
    if protocol is not None:
        p = get_protocol(protocol)
        tails = [p.observation([])[2], p.invalid_observation()[2], p.force_answer_message()]
        for tail in tails:
            ids = tokenizer.encode(tail, add_special_tokens=False)
            if ids:
                starts["observation"].append(ids[-1])
    return {kind: sorted(set(ids)) for kind, ids in starts.items()}


def script_paths(
    tokenizer: Any, script: Script, protocol: str | None
) -> list[tuple[list[int], float]]:
    """Token paths (start token, the text's ids, then end of sequence unless the text ends in one
    of the protocol's stop strings: generation ends there) with their weights."""
    eos = tokenizer.eos_token_id
    stops = get_protocol(protocol).stop if protocol else []
    starts = start_tokens(tokenizer, protocol)
    paths = []
    for text, weight, where in script:
        ids = tokenizer.encode(text, add_special_tokens=False)
        end = [] if any(text.rstrip("\n").endswith(s) for s in stops) else [eos]
        kinds = ("prompt", "observation") if where == "any" else (where,)
        for start in sorted({t for kind in kinds for t in starts[kind]}):
            paths.append(([start, *ids, *end], weight))
    return paths


def greedy_walk(chain: dict[int, dict[int, float]], start: int, default: int, n: int) -> list[int]:
    """The chain's most likely continuation of ``start`` (``n`` tokens at most, to ``default``)."""
    out, cur = [], start
    for _ in range(n):
        row = chain.get(cur)
        cur = max(row, key=row.get) if row else default
        out.append(cur)
        if cur == default:
            break
    return out
