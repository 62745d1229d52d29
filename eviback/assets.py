"""Turning ``assets`` into objects: question sets with quotas, the retriever, the teacher."""

from __future__ import annotations

import hashlib
import json
import random
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.api_budget import ApiBudget
from common.data import QAExample, keep_where, load_qa, question_char_limit
from common.llm_client import LLMClient
from common.retrieval.base import Retriever
from common.rollout.agent import AgentConfig
from common.run_config import EngineConfig
from eviback.config import AssetsConfig, TeacherConfig
from eviback.oracle import EvidenceOracle
from eviback.prompts import STAGE_A_DEFAULT, STAGE_B_DEFAULT
from eviback.teacher import Teacher, TeacherPolicy, TwoStageTeacher

SELECTIONS = ("random", "sha256")


def normalize_question(text: str) -> str:
    """The release's question key: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def selection_key(original_id: str, question: str, source: str, seed: int) -> str:
    """The release's rank of a question within its source: the SHA-256 hex digest of the
    canonical JSON (sorted keys, no spaces, UTF-8) of ``{seed, source, id, question}``, with the
    question normalised (``normalize_question``)."""
    identity = {
        "seed": seed,
        "source": source,
        "id": original_id,
        "question": normalize_question(question),
    }
    text = json.dumps(identity, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def stable_selection(
    examples: Sequence[QAExample], source: str, count: int, seed: int
) -> list[QAExample]:
    """The release's draw of ``count`` questions from one source: drop questions with no
    non-blank gold answer, keep one example per normalised question (the lowest key), rank by
    ``selection_key`` and take the first ``count``. ``source`` is the release's name of the
    source (it enters the key); ids are the files' ids, after the ``source:`` prefix."""
    best: dict[str, tuple[str, QAExample]] = {}
    for ex in examples:
        question = normalize_question(ex.question)
        if not question or not any(a.strip() for a in ex.golden_answers):
            continue
        key = selection_key(ex.id.split(":", 1)[-1], ex.question, source, seed)
        if question not in best or key < best[question][0]:
            best[question] = (key, ex)
    ranked = sorted(best.values(), key=lambda pair: pair[0])
    if len(ranked) < count:
        raise ValueError(
            f"quota {source}={count} exceeds the {len(ranked)} distinct answerable questions"
        )
    return [ex for _, ex in ranked[:count]]


def load_questions(
    files: Mapping[str, str],
    quotas: Mapping[str, int],
    seed: int,
    selection: str = "random",
    release_names: Mapping[str, str] | None = None,
    where: Mapping[str, Sequence[str]] | None = None,
    where_key: str = "train_where",
    max_question_chars: int | None = None,
) -> list[QAExample]:
    """Every file's examples (ids ``{source}:{id}``), kept by ``where`` (``keep_where``; named
    ``assets.<where_key>`` in errors), cut to its quota. A file is jsonl, a JSON list or parquet
    (Search-R1's ``train.parquet``: ``common.data.read_rows``).

    A bad row (a lone surrogate, a ``NaN`` answer, ...) is a ``DataError`` naming the file and
    line; a question over ``max_question_chars`` characters (``question_chars``) is left out and
    counted (``common.data.load_qa``), as CER leaves out over-long prompts, before quotas.

    ``selection="random"``: a draw seeded by ``seed`` and the source name. ``"sha256"``: the
    release's draw (``stable_selection``, ``seed`` = its selection seed), with each source under
    its release name (``release_names``, e.g. 2wiki -> 2wikimultihopqa). A quota naming no
    file, or larger than its file, is an error.
    """
    if selection not in SELECTIONS:
        raise ValueError(f"question selection must be one of {SELECTIONS}, got {selection!r}")
    unknown = sorted(set(quotas) - set(files))
    if unknown:
        raise ValueError(f"quotas name sources without a file: {', '.join(unknown)}")
    out: list[QAExample] = []
    matched: set[tuple[str, str]] = set()
    for source, path in files.items():
        examples = load_qa(path, source=source, max_question_chars=max_question_chars)
        if where:
            examples = keep_where(examples, where, matched)
        quota = quotas.get(source)
        if quota is not None:
            if quota > len(examples):
                raise ValueError(
                    f"quota {source}={quota} exceeds the {len(examples)} questions in {path}"
                )
            if selection == "sha256":
                name = (release_names or {}).get(source, source)
                try:
                    examples = stable_selection(examples, name, quota, seed)
                except ValueError as e:
                    raise ValueError(f"{path}: {e}") from None
            else:
                examples = random.Random(f"{seed}:{source}").sample(examples, quota)
        out.extend(examples)
    unmatched = [
        f"{k}={v}" for k, vs in (where or {}).items() for v in vs if (k, str(v)) not in matched
    ]
    if unmatched:
        raise ValueError(
            f"assets.{where_key}: {', '.join(unmatched)} matches no question in "
            f"{', '.join(map(str, files.values()))}"
        )
    return out


def question_chars(agent: AgentConfig, engine: EngineConfig) -> int:
    """The character bound of a question (``common.data.question_char_limit``) for the agent's
    prompt budget: ``agent.max_context`` and ``engine.max_model_len`` tokens, the smaller."""
    return question_char_limit(agent.max_context, engine.max_model_len)


def select_questions(
    assets: AssetsConfig, kind: str, seed: int, max_question_chars: int | None = None
) -> list[QAExample]:
    """The ``train`` or ``eval`` question set of ``assets`` with its quotas, drawn as
    ``assets.selection`` says (sha256: with that set's selection seed; random: with ``seed``);
    ``max_question_chars``: ``load_questions``'."""
    files, quotas, selection_seed = {
        "train": (assets.files("train"), assets.train_quotas, assets.train_selection_seed),
        "eval": (assets.files("eval"), assets.eval_quotas, assets.eval_selection_seed),
    }[kind]
    draw_seed = selection_seed if assets.selection == "sha256" else seed
    where = assets.train_where if kind == "train" else None
    return load_questions(
        files,
        quotas,
        draw_seed,
        assets.selection,
        assets.release_names,
        where=where,
        max_question_chars=max_question_chars,
    )


def source_of(example_id: str) -> str:
    """The benchmark an example came from: its id's prefix (``load_questions`` sets it)."""
    return example_id.split(":", 1)[0]


def build_retriever(assets: AssetsConfig) -> Retriever:
    """The Search-R1 server when ``retrieval_url`` is set, else an index folder or BM25 in process."""
    if assets.retrieval_url:
        from common.retrieval.client import HTTPRetriever

        return HTTPRetriever(assets.retrieval_url, max_wait=assets.retrieval_max_wait_s)
    from common.retrieval.index_folder import is_index_folder, load_index

    if is_index_folder(assets.corpus):
        return load_index(assets.corpus)
    from common.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_corpus(assets.corpus)


def llm_client(
    endpoint: str,
    model: str,
    teacher: TeacherConfig,
    cache_dir: str | Path | None,
    api_key_env: str = "OPENAI_API_KEY",
    budget: ApiBudget | None = None,
    prices: tuple[float, float] = (0.0, 0.0),
    tokenizer: str = "",
) -> LLMClient:
    """A client of ``endpoint`` with the teacher's request settings; the key is read from the
    environment variable ``api_key_env`` (``assets.api_key_env``). ``budget``: the command's API
    cap, shared by its clients; ``prices``: USD per million prompt and completion tokens;
    ``tokenizer``: the model's (``assets.teacher_tokenizer`` for the teacher), else bytes. A
    reply from another model is refused (``teacher.reply_models``); one its caller refuses (a
    broken verdict) is asked again ``teacher.contract_retries`` times."""
    return LLMClient(
        endpoint,
        model,
        api_key_env=api_key_env,
        reasks=teacher.contract_retries,
        reply_models=teacher.reply_models,
        tokenizer=tokenizer or None,
        budget=budget,
        price_prompt_per_mtok=prices[0],
        price_completion_per_mtok=prices[1],
        max_concurrency=teacher.max_concurrency,
        timeout=teacher.timeout,
        deadline=teacher.deadline,
        retries=teacher.retries,
        backoff=teacher.backoff,
        cache_dir=cache_dir,
        temperature=teacher.temperature,
        top_p=teacher.top_p,
        max_tokens=teacher.max_tokens,
    )


def teacher_policy(teacher: TeacherConfig) -> TeacherPolicy:
    """The frozen E2E-APE policy, else the hand-written gated two-stage or its stage-A prompt
    alone (``teacher.prompts``)."""
    if teacher.policy_file:
        from eviback.ape import read_policy_file

        return read_policy_file(teacher.policy_file)[0]
    if teacher.prompts == "single":
        return TeacherPolicy(STAGE_A_DEFAULT.id)
    return TeacherPolicy(STAGE_A_DEFAULT.id, STAGE_B_DEFAULT.id)


def build_teacher(
    assets: AssetsConfig,
    teacher: TeacherConfig,
    cache_dir: str | Path | None,
    probe: bool = False,
) -> Teacher | None:
    """None when the teacher is off (the Search-R1 baseline). ``probe``: an LLM teacher's
    endpoint must answer and serve ``assets.teacher_model`` (``LLMClient.probe``; an
    ``EndpointError`` in one line otherwise)."""
    if not teacher.enabled:
        return None
    if teacher.backend == "oracle":
        return EvidenceOracle(teacher.top_m)
    client = llm_client(
        assets.teacher_endpoint,
        assets.teacher_model,
        teacher,
        cache_dir,
        assets.api_key_env,
        tokenizer=assets.teacher_tokenizer,
    )
    if probe:
        client.probe()
    return TwoStageTeacher(client, teacher_policy(teacher))
