"""CER's rewards, one public entry per idea (the modules beside this one hold the rest).

For a prompt q, its G sampled responses s_j (solution and boxed answer a_j) and the reference
a*, CER rewards sample k with the policy's own probability of the reference after the group's
solutions, each solution weighted by how likely it makes sample k's answer:

    R_k = sum_j pi(a_k | q, s_j) * pi(a* | q, s_j) / sum_j pi(a_k | q, s_j)

Entries (``reward.fn`` names them by type; each is also importable from here):

- ``EXACT``, ``RULE``, ``CER``, ``RULE_CER``, ``VERIFREE``: the outcome rewards a config picks
  (``groups.GroupReward``), as ``common.rewards`` reward parts;
- ``group_rewards``: every requested type over sampled groups at once, CER scored in one batch;
- ``cer_from_logprobs``: the formula above on the scorer's log-probabilities (``expectation``);
- ``hf_prefix_scorer``: the scorer that fills them on the training model (``scoring``);
- ``solution_split``: a response cut into solution and boxed answer on its token ids (``answer``);
- ``exact_verifier``, ``rule_verifier``, ``alias_verifier``: the verifiers (``verifiers``);
- ``AgentCER``: CER for the search agent's ``<answer>`` (``search_agent``);
- ``signal_metrics``: whether the reward separates right from wrong samples (``diagnostics``).

The names load on first use, so ``import cer.rewards`` costs no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_ENTRIES = {
    "EXACT": "groups",
    "RULE": "groups",
    "CER": "groups",
    "RULE_CER": "groups",
    "VERIFREE": "groups",
    "GroupReward": "groups",
    "group_rewards": "groups",
    "cer_from_logprobs": "expectation",
    "hf_prefix_scorer": "scoring",
    "solution_split": "answer",
    "exact_verifier": "verifiers",
    "rule_verifier": "verifiers",
    "alias_verifier": "verifiers",
    "AgentCER": "search_agent",
    "signal_metrics": "diagnostics",
}
__all__ = sorted(_ENTRIES)


def __getattr__(name: str) -> Any:
    if name not in _ENTRIES:
        raise AttributeError(f"module 'cer.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cer.rewards.{_ENTRIES[name]}"), name)
