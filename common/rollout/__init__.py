"""Rollout generation: engines (vLLM, HF) and the multi-turn search agent."""

from common.rollout.agent import AgentConfig, build_prompt_ids, run_agent
from common.rollout.engine import Completion, GenerationEngine, SamplingConfig
from common.rollout.hf_engine import HFEngine
from common.rollout.protocols import get_protocol
from common.rollout.trajectory import Step, Trajectory

__all__ = [
    "AgentConfig",
    "Completion",
    "GenerationEngine",
    "HFEngine",
    "SamplingConfig",
    "Step",
    "Trajectory",
    "build_prompt_ids",
    "get_protocol",
    "run_agent",
]


def __getattr__(name: str):
    # vllm is heavy and optional at import time; load it only when asked for.
    if name == "VLLMEngine":
        from common.rollout.vllm_engine import VLLMEngine

        return VLLMEngine
    raise AttributeError(name)
