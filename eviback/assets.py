"""Turning ``assets`` into objects: question sets with quotas, the retriever, the teacher."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from common.data import QAExample, load_qa
from common.llm_client import LLMClient
from common.retrieval.base import Retriever
from eviback.config import AssetsConfig, TeacherConfig
from eviback.oracle import EvidenceOracle
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT
from eviback.teacher import Teacher, TeacherPolicy, TwoStageTeacher


def load_questions(
    files: Mapping[str, str], quotas: Mapping[str, int], seed: int
) -> list[QAExample]:
    """Every file's examples (ids ``{source}:{id}``), cut to its quota by a seeded draw.

    A quota naming no file, or larger than its file, is an error.
    """
    unknown = sorted(set(quotas) - set(files))
    if unknown:
        raise ValueError(f"quotas name sources without a file: {', '.join(unknown)}")
    out: list[QAExample] = []
    for source, path in files.items():
        examples = load_qa(path, source=source)
        quota = quotas.get(source)
        if quota is not None:
            if quota > len(examples):
                raise ValueError(
                    f"quota {source}={quota} exceeds the {len(examples)} questions in {path}"
                )
            examples = random.Random(f"{seed}:{source}").sample(examples, quota)
        out.extend(examples)
    return out


def source_of(example_id: str) -> str:
    """The benchmark an example came from: its id's prefix (``load_questions`` sets it)."""
    return example_id.split(":", 1)[0]


def build_retriever(assets: AssetsConfig) -> Retriever:
    """The Search-R1 server when ``retrieval_url`` is set, else an index folder or BM25 in process."""
    if assets.retrieval_url:
        from common.retrieval.client import HTTPRetriever

        return HTTPRetriever(assets.retrieval_url)
    from common.retrieval.index_folder import is_index_folder, load_index

    if is_index_folder(assets.corpus):
        return load_index(assets.corpus)
    from common.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_corpus(assets.corpus)


def llm_client(
    endpoint: str, model: str, teacher: TeacherConfig, cache_dir: str | Path | None
) -> LLMClient:
    return LLMClient(
        endpoint,
        model,
        api_key_env=teacher.api_key_env,
        max_concurrency=teacher.max_concurrency,
        timeout=teacher.timeout,
        retries=teacher.retries,
        cache_dir=cache_dir,
        temperature=teacher.temperature,
        top_p=teacher.top_p,
        max_tokens=teacher.max_tokens,
    )


def teacher_policy(teacher: TeacherConfig) -> TeacherPolicy:
    """The frozen E2E-APE policy, or the hand-written gated two-stage default."""
    if teacher.policy_file:
        from eviback.ape import read_policy_file

        return read_policy_file(teacher.policy_file)[0]
    return TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id)


def build_teacher(
    assets: AssetsConfig, teacher: TeacherConfig, cache_dir: str | Path | None
) -> Teacher | None:
    """None when the teacher is off (the Search-R1 baseline)."""
    if not teacher.enabled:
        return None
    if teacher.backend == "oracle":
        return EvidenceOracle(teacher.top_m)
    client = llm_client(assets.teacher_endpoint, assets.teacher_model, teacher, cache_dir)
    return TwoStageTeacher(client, teacher_policy(teacher))
