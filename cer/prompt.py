"""The CER prompt: the model's chat template around a system line and the question.

system: "You are a helpful assistant."; user: the question, then the instruction to reason step by
step and box the final answer (multiple-choice questions: the release's, the letter alone in the
box, on the same line: ``recipe/cer/src/data_preparation.py``'s ``qwen_multi_choice_prompt``); a
short-answer row (``metadata["short_answer"]``: reading comprehension) asks for a short phrase
from the paragraphs and nothing else, as a small model can follow (``benchmarks/RESULTS.md``
"SmolLM2 before training": SmolLM2-135M boxes 1% of its answers when asked to).
"""

from __future__ import annotations

from typing import Any

from cer.data import MathExample

SYSTEM_PROMPT = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
# appended to INSTRUCTION after a space (the release's qwen_multi_choice_prompt): the letter in
# the box is what ``choice_verifier: strict`` (the release's check) scores
MC_INSTRUCTION = "Please only provide the letter of the answer in the box."
SHORT_INSTRUCTION = (
    "Read the paragraphs, then answer the question with a short phrase taken from them. "
    "Reply with the answer only."
)


def user_message(example: MathExample) -> str:
    """The question followed by the instruction(s)."""
    if example.metadata.get("short_answer"):
        return "\n".join([example.problem.strip(), SHORT_INSTRUCTION])
    instruction = INSTRUCTION
    if example.metadata.get("multiple_choice"):
        instruction = f"{INSTRUCTION} {MC_INSTRUCTION}"
    return "\n".join([example.problem.strip(), instruction])


def prompt_ids(tokenizer: Any, example: MathExample) -> list[int]:
    """Token ids of the chat-templated system + user turns and the assistant header."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; "
            "CER prompts are chat-formatted"
        )
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_message(example)},
    ]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
