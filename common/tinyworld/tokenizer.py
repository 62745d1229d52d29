"""A tiny byte-level BPE tokenizer for the tiny world, with the agent's tags as single tokens."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The words of the agent protocol (Search-R1's instruction, document and chat formatting), so
# that prompts tokenize into whole words like the world's own text.
PROTOCOL_TEXT = (
    "system user assistant\n"
    "Answer the given question. You must conduct reasoning inside <think> and </think> first "
    "every time you get new information. After reasoning, if you find you lack some knowledge, "
    "you can call a search engine by <search> query </search> and it will return the top "
    "searched results between <information> and </information>. You can search as many times "
    "as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Question: \n"
    "Doc 1 (Title: ) Doc 2 (Title: ) Doc 3 (Title: ) Doc 4 (Title: ) Doc 5 (Title: )\n"
    "My previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
    "yes no 0 1 2 3 4 5 6 7 8 9\n"
)
_TAG_PATTERN = re.compile("|".join(re.escape(t) for t in TAGS + SPECIAL_TOKENS))


def build_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    split_digits: bool = False,
    isolate_spaces: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of `vocab_size` ids in all (specials and tags included).

    Ids 0-2 are the special tokens, the last len(TAGS) ids the tags; training is deterministic:
    the same texts give the same tokenizer.json. With `split_digits` every digit is a token of
    its own, as in Qwen's tokenizer: a year is then four frequent tokens a small model can copy,
    not one of a hundred rare ones. With `isolate_spaces` a space is a token of its own and never
    part of a word's first token, so a word has one tokenization wherever it stands (`" Fashe"`,
    `"{Fashe"` and `"Fashe"` at a line start all end in the same ids): copying it is then a
    plain repeat of ids.
    """
    n_learned = vocab_size - len(TAGS)
    if n_learned < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size {vocab_size} leaves no room beyond the 256 bytes and the tags"
        )
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    steps = [pre_tokenizers.Split(" ", behavior="isolated")] if isolate_spaces else []
    steps += [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    tok.pre_tokenizer = pre_tokenizers.Sequence([*steps, byte_level]) if steps else byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=n_learned,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Tags and special tokens are matched before BPE ever sees the text, so BPE must not spend
    # merges on their pieces.
    corpus = [_TAG_PATTERN.sub(" ", text) for text in (PROTOCOL_TEXT, *texts)]
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )
