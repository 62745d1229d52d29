"""Rollout generation: engines (vLLM, HF) and the multi-turn search agent.

The names below load on first use (PEP 562): importing ``common.rollout.agent`` for
``AgentConfig`` loads no engine, torch or vLLM.
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "AgentConfig": "common.rollout.agent",
    "build_prompt_ids": "common.rollout.agent",
    "run_agent": "common.rollout.agent",
    "Completion": "common.rollout.engine",
    "GenerationEngine": "common.rollout.engine",
    "SamplingConfig": "common.rollout.engine",
    "HFEngine": "common.rollout.hf_engine",
    "get_protocol": "common.rollout.protocols",
    "Step": "common.rollout.trajectory",
    "Trajectory": "common.rollout.trajectory",
    "VLLMEngine": "common.rollout.vllm_engine",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'common.rollout' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
