"""The search agent's turns under Qwen3's real tokenizer (tests/qwen_tokenizer.py).

Qwen's byte-level BPE merges a closing tag's ``>`` with what follows: ``</search>\\n\\n`` ends in
the single token ``>\\n\\n`` (1339) and ``</answer>.`` in ``>.`` (14276), so a stop string ends
inside a token. The turn must stop at that token, keep it whole (the trainer sees exactly the
sampled ids) and still parse the query or the answer. The ids below were checked by hand against
the tokenizer (and tests/test_qwen_tokenizer.py checks the tokenizer against tiktoken's).
"""

from __future__ import annotations

import pytest
from successor_model import build_successor_model, save_successor_model, successor_table

from common.rollout.agent import AgentConfig, _take_turn, build_prompt_ids, encode_text
from common.rollout.engine import Completion, SamplingConfig, stop_length
from common.rollout.hf_engine import HFEngine
from common.rollout.protocols import get_protocol
from common.rollout.trajectory import Trajectory

SEARCH_R1 = get_protocol("search_r1")
SEARCH_TURN = "<search>Krodrour Zeibum</search>\n\n"
SEARCH_IDS = [27, 1836, 53300, 299, 3612, 413, 9919, 579, 372, 522, 1836, 1339]
ANSWER_TURN = "<answer>Zuro</answer>."
ANSWER_IDS = [27, 9217, 63416, 2798, 522, 9217, 14276]


def test_the_closing_tags_merge_with_what_follows(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert encode_text(tok, SEARCH_TURN) == SEARCH_IDS
    assert encode_text(tok, ANSWER_TURN) == ANSWER_IDS
    pieces = [tok.decode([i]) for i in (1339, 14276, 397)]
    assert pieces == [">\n\n", ">.", ">\n"]


def test_a_stop_string_ending_inside_a_token_keeps_that_token(qwen3_tokenizer):
    tok = qwen3_tokenizer
    piece = lambda i: tok.decode([i], skip_special_tokens=False)  # noqa: E731
    more = encode_text(tok, "<information>Doc 1")
    for turn_ids in (SEARCH_IDS, ANSWER_IDS):
        assert stop_length(turn_ids + more, piece, SEARCH_R1.stop, set()) == (len(turn_ids), True)
    # the forced turn stops on </answer> only: a merged </search> runs on into the answer
    row = SEARCH_IDS + ANSWER_IDS + more
    assert stop_length(row, piece, SEARCH_R1.answer_stop, set()) == (len(row) - len(more), True)
    # without a stop string the turn runs to its end; an end-of-message id stops it at once
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_length(SEARCH_IDS[:5] + [eos, 9], piece, SEARCH_R1.stop, {eos}) == (6, True)
    assert stop_length(SEARCH_IDS[:5], piece, SEARCH_R1.stop, {eos}) == (5, False)


@pytest.mark.parametrize("turn_ids, kind", [(SEARCH_IDS, "search"), (ANSWER_IDS, "answer")])
def test_a_merged_turn_parses_and_stays_token_exact(qwen3_tokenizer, turn_ids, kind):
    tok = qwen3_tokenizer
    prompt = build_prompt_ids(tok, SEARCH_R1, "Where was Krodrour Zeibum born?")
    t = Trajectory("r", 0, "q", "Where was Krodrour Zeibum born?", ["Zuro"], prompt)
    logprobs = [-0.1 * (i + 1) for i in range(len(turn_ids))]
    text = tok.decode(turn_ids, skip_special_tokens=False)
    invalid = encode_text(tok, SEARCH_R1.invalid_message())
    query = _take_turn(
        t, Completion(turn_ids, logprobs, text, "stop"), SEARCH_R1, tok, invalid, AgentConfig()
    )
    assert t.response_ids == turn_ids and t.loss_mask == [1] * len(turn_ids)
    assert t.sampling_logprobs == logprobs
    assert [(s.kind, s.start, s.end) for s in t.steps] == [(kind, 0, len(turn_ids))]
    if kind == "search":
        assert query == "Krodrour Zeibum" and not t.done
    else:
        assert query is None and (t.answer, t.done) == ("Zuro", True)


@pytest.fixture(scope="module")
def scripted_qwen3(tiny_qwen3_dir, qwen3_tokenizer, tmp_path_factory):
    """A Qwen3-vocabulary model that greedily writes the search turn's body after the prompt's
    last token, then the observation's first tokens (which a stopped turn must not include).
    The opening `<search>` would repeat the token `search`, which a successor model cannot
    script, so the turn starts at the query: the stop is what is under test."""
    tok = qwen3_tokenizer
    prompt = build_prompt_ids(tok, SEARCH_R1, "Where was Krodrour Zeibum born?")
    body = SEARCH_IDS[2:]  # '>K' ... '</' 'search' '>\n\n'
    path = [prompt[-1], *body, *encode_text(tok, "<information>Doc")]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model = build_successor_model(tiny_qwen3_dir, successor_table(path), eos)
    folder = save_successor_model(model, tok, tmp_path_factory.mktemp("qwen3_succ") / "model")
    return model, folder, prompt, body


@pytest.mark.parametrize("backend", ["hf", pytest.param("vllm", marks=pytest.mark.slow)])
def test_engines_stop_on_the_merged_closing_tag(scripted_qwen3, qwen3_tokenizer, backend):
    model, folder, prompt, body = scripted_qwen3
    if backend == "hf":
        engine = HFEngine(model, qwen3_tokenizer)
    else:
        from common.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(folder, kv_cache_bytes=64 * 2**20, max_model_len=256)
    params = SamplingConfig(n=1, temperature=0.0, max_tokens=24, stop=list(SEARCH_R1.stop))
    ((comp,),) = engine.generate([prompt], params)
    assert comp.token_ids == body and comp.finish_reason == "stop"
    assert qwen3_tokenizer.decode(comp.token_ids).endswith("</search>\n\n")
    assert len(comp.logprobs) == len(body)
