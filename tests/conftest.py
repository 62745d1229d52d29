"""Session-wide fixtures: the tiny world is built once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The default-size tiny world (seed 0): corpus, questions, tokenizer and random model."""
    from common.tinyworld import build_world

    return build_world(tmp_path_factory.mktemp("tinyworld") / "world", seed=0)
