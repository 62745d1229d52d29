"""The embedded tiny world: a seeded synthetic knowledge base, its corpus, multi-hop questions,
and a tiny tokenizer and Qwen3 model, built with `python -m common.tinyworld build`."""

from common.tinyworld.build import build_world, describe
from common.tinyworld.questions import Question, SplitSizes, make_questions
from common.tinyworld.world import (
    City,
    Country,
    Document,
    Film,
    Organisation,
    Person,
    World,
    WorldSizes,
    documents,
    generate_world,
    load_world,
    permute_names,
)

__all__ = [
    "City",
    "Country",
    "Document",
    "Film",
    "Organisation",
    "Person",
    "Question",
    "SplitSizes",
    "World",
    "WorldSizes",
    "build_world",
    "describe",
    "documents",
    "generate_world",
    "load_world",
    "make_questions",
    "permute_names",
]
