"""Supervised warmup on gold search paths.

A gold trajectory is what an ideal agent would do: search each query of the question's gold
path, read the retrieved documents, answer. It is assembled exactly as a rollout is (the
agent's turns as "sampled" ids, observations inserted by the real retriever), and the loss
falls on the agent's own tokens only.

The gold path is ``metadata["gold_queries"]`` (the tiny world writes it) or, for real multi-hop
data (HotpotQA, 2Wiki, MuSiQue), the supporting paragraphs' titles in the order the data lists
them (``gold_path``): a title is the query that finds its paragraph, and HotpotQA lists a
bridge question's paragraphs in reasoning order. On a pretrained model (``SCALE=smol``) the
warmup is a format warmup: it teaches the search protocol, which the model cannot follow
untrained.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from common.config import ConfigError, describe_config, dump_config, load_config
from common.data import DataError, QAExample, load_qa
from common.retrieval.base import Retriever
from common.rollout.agent import AgentConfig, build_prompt_ids, encode_text, observation_ids
from common.rollout.protocols import get_protocol
from common.rollout.trajectory import Step, Trajectory
from common.train.config import TrainConfig

if TYPE_CHECKING:  # annotations only: torch, the engine and BM25 load where they run
    import torch

    from common.train.engine import TrainEngine


def gold_trajectories(
    examples: Sequence[QAExample],
    tokenizer,
    retriever: Retriever,
    cfg: AgentConfig,
    shortcut_rate: float = 0.0,
    seed: int = 0,
) -> list[Trajectory]:
    """One gold trajectory per example that has a gold path (``gold_path``).

    All hop-h queries go to the retriever in one call, as in a rollout turn. With
    ``shortcut_rate`` > 0 the teacher is deliberately weak: that share of the bridge questions
    (drawn with ``seed``) stop after the first search and answer with the first hop's entity
    (``gold_queries[1]``, named in the documents just read): the classic under-searching
    mistake, a decision that RL can unlearn.
    """
    protocol = get_protocol(cfg.protocol)
    usable = [ex for ex in examples if gold_path(ex)]
    if not usable:
        raise ValueError(
            "no example has metadata['gold_queries'] or ['supporting_titles']: nothing to warmup on"
        )
    rng = random.Random(seed)
    plans = [_teacher_plan(ex, shortcut_rate, rng) for ex in usable]
    trajs = [
        Trajectory(
            f"gold:{ex.id}",
            0,
            ex.id,
            ex.question,
            list(ex.golden_answers),
            build_prompt_ids(tokenizer, protocol, ex.question, cfg.instruction),
        )
        for ex in usable
    ]
    max_hops = max(len(queries) for queries, _ in plans)
    for hop in range(max_hops):
        active = [
            (t, queries[hop])
            for t, (queries, _) in zip(trajs, plans, strict=True)
            if hop < len(queries)
        ]
        results = retriever.search([q for _, q in active], cfg.topk)
        for (t, q), docs in zip(active, results, strict=True):
            ids = encode_text(tokenizer, protocol.format_search(q))
            start = len(t.response_ids)
            t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
            t.steps.append(Step("search", start, len(t.response_ids), query=q, docs=list(docs)))
            t.num_searches += 1
            t.append(observation_ids(tokenizer, protocol, docs, cfg.max_obs_tokens), False)
    for t, (_, answer) in zip(trajs, plans, strict=True):
        ids = encode_text(tokenizer, protocol.format_answer(answer))
        start = len(t.response_ids)
        t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
        t.steps.append(Step("answer", start, len(t.response_ids)))
        t.answer, t.done = answer, True
    return trajs


def gold_path(ex: QAExample) -> list[str]:
    """The queries an ideal agent issues for ``ex``: ``metadata["gold_queries"]``, else the
    supporting titles (each once, in the data's order); [] when the data has neither."""
    return list(ex.metadata.get("gold_queries") or ex.metadata.get("supporting_titles") or [])


def _teacher_plan(ex: QAExample, shortcut_rate: float, rng: random.Random) -> tuple[list, str]:
    """(queries, answer) the teacher writes for ``ex``: the gold path, or the shortcut."""
    queries = gold_path(ex)
    draw = rng.random()  # one draw per example, so the choice for one does not shift the others
    if ex.metadata.get("type") == "bridge" and len(queries) > 1 and draw < shortcut_rate:
        return queries[:1], queries[1]
    return queries, ex.golden_answers[0]


def sft_loss(
    engine: TrainEngine, batch, context_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-mean negative log-likelihood of the agent's own tokens, plus ``context_weight`` times
    the token-mean NLL of every other token (prompt and retrieved documents).

    The context term is ordinary language modelling on the prompt and documents: it costs no
    extra forward pass, and a document repeats its title in its text, which is the copying the
    agent must learn (names from the question into a query, from a document into the answer).
    Returns the loss and the agent-token NLL alone (what is logged).
    """
    from common.rl import forward_logprobs

    logp = forward_logprobs(engine, batch.input_ids, batch.attention_mask)  # [B, T-1]
    own = batch.loss_mask
    agent_nll = -(logp * own).sum() / own.sum().clamp(min=1)
    loss = agent_nll
    if context_weight:
        context = batch.attention_mask[:, 1:].to(logp.dtype) * (1 - own)
        loss = loss - context_weight * (logp * context).sum() / context.sum().clamp(min=1)
    return loss, agent_nll.detach()


def sft_warmup(
    engine: TrainEngine,
    trajs: Sequence[Trajectory],
    pad_id: int,
    steps: int,
    batch_size: int,
    seed: int = 0,
    log_every: int = 50,
    context_weight: float = 0.0,
) -> list[dict]:
    """``steps`` optimizer steps of SFT over shuffled epochs of ``trajs``; returns the loss log.

    Each optimizer step sees ``batch_size`` trajectories, split into ``grad_accum`` micro-batches.
    """
    from common.rollout.batch import collate
    from common.train.logging import progress

    rng = random.Random(seed)
    accum = engine.config.grad_accum
    micro = max(batch_size // accum, 1)
    order: list[int] = []
    history, running = [], 0.0
    for step in progress(range(steps), desc="warmup", total=steps):
        for _ in range(accum):
            idx = []
            while len(idx) < micro:
                if not order:
                    order = list(range(len(trajs)))
                    rng.shuffle(order)
                idx.append(order.pop())
            batch = collate([trajs[i] for i in idx], pad_id).to(engine.device)
            loss, agent_nll = sft_loss(engine, batch, context_weight)
            engine.backward(loss)
            engine.step()
            running += agent_nll.item() / accum
        if (step + 1) % log_every == 0:
            history.append({"step": step + 1, "sft_loss": running / log_every})
            running = 0.0
    return history


@dataclass
class WarmupConfig:
    """Supervised warmup of a search agent on gold paths: a tiny world's files unless ``model``,
    ``train_data`` or ``corpus`` names another (``common/configs/warmup_smol.yaml``)."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by run_warmup; refused in configs and overrides
        "train.total_steps": "steps",
        "train.seed": "seed",
    }

    world: str = field(
        default="runs/tinyworld/seed0",
        metadata={"help": "tiny world folder: the default model, train and corpus"},
    )
    model: str = field(default="", metadata={"help": "HF model folder (default: <world>/model)"})
    train_data: str = field(
        default="", metadata={"help": "QA file with gold paths (default: <world>/train.jsonl)"}
    )
    corpus: str = field(default="", metadata={"help": "corpus (default: <world>/corpus.jsonl)"})
    out: str = field(default="runs/warmup/tiny", metadata={"help": "output folder"})
    seed: int = field(default=0, metadata={"help": "data order and init seed", "ge": 0})
    steps: int = field(default=600, metadata={"help": "optimizer steps", "ge": 1})
    batch_size: int = field(
        default=16, metadata={"help": "trajectories per optimizer step", "ge": 1}
    )
    context_weight: float = field(
        default=0.0,
        metadata={
            "help": "weight of the LM loss on prompt and document tokens (0: agent only)",
            "ge": 0,
        },
    )
    shortcut_rate: float = field(
        default=0.0,
        metadata={
            "help": "share of bridge questions the teacher answers after one search with the "
            "first hop's entity (a weak teacher, for RL to correct; 0: gold paths only)",
            "ge": 0,
            "le": 1,
        },
    )
    agent: AgentConfig = field(default_factory=AgentConfig)
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(lr=3e-3, warmup_steps=30, scheduler="cosine")
    )


def run_warmup(cfg: WarmupConfig) -> Path:
    """Gold trajectories of the train split -> SFT -> ``<out>/model`` (HF folder)."""
    from common.retrieval.bm25 import BM25Retriever

    paths = warmup_paths(cfg)
    train_set = load_qa(paths["train_data"])  # a bad row costs nothing: read before any model loads

    def trajectories(tokenizer) -> list[Trajectory]:
        retriever = BM25Retriever.from_corpus(paths["corpus"])
        return gold_trajectories(
            train_set, tokenizer, retriever, cfg.agent, cfg.shortcut_rate, cfg.seed
        )

    sft = SFTRun(cfg.steps, cfg.batch_size, cfg.seed, cfg.context_weight)
    return sft_and_save(cfg, Path(cfg.out), paths["model"], trajectories, cfg.train, sft)[0]


@dataclass(frozen=True)
class SFTRun:
    """How long and on what a warmup's SFT runs: ``steps`` optimizer steps of ``batch_size``
    trajectories, data order and init from ``seed``, the context term's weight."""

    steps: int
    batch_size: int
    seed: int
    context_weight: float = 0.0


def sft_and_save(
    cfg: Any,
    out: Path,
    model: str | Path,
    trajectories: Callable[[Any], list[Trajectory]],
    train: TrainConfig,
    sft: SFTRun,
) -> tuple[Path, list[dict], int]:
    """A supervised warmup from its data to ``out/model`` (the gold-path warmup's and CER's):
    ``out`` locked (one warmup at a time), the tokenizer and the float32 model of ``model``,
    ``trajectories(tokenizer)``, ``sft_warmup`` under ``train`` (its ``total_steps`` and
    ``seed`` set from ``sft``: the configs' derived keys), ``save_warmup`` of ``cfg``. Returns
    ``out/model``, the loss log and the number of trajectories."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.rollout.batch import padding_id
    from common.train.engine import TrainEngine
    from common.train.run_folder import open_run_folder

    folder = open_run_folder(out, None, resume=False)
    tokenizer = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    trajs = trajectories(tokenizer)
    train.total_steps = sft.steps
    train.seed = sft.seed
    engine = TrainEngine(lm, train)
    history = sft_warmup(
        engine,
        trajs,
        padding_id(tokenizer),
        sft.steps,
        sft.batch_size,
        sft.seed,
        context_weight=sft.context_weight,
    )
    saved = save_warmup(engine, tokenizer, cfg, out, history)
    folder.close()
    return saved, history, len(trajs)


def warmup_paths(cfg: WarmupConfig) -> dict[str, Path]:
    """The model, train and corpus paths (``cfg``'s, else the world's), each checked to exist;
    a missing one is a ``FileNotFoundError`` that says how to make it."""
    world = Path(cfg.world)
    paths = {
        "model": Path(cfg.model or world / "model"),
        "train_data": Path(cfg.train_data or world / "train.jsonl"),
        "corpus": Path(cfg.corpus or world / "corpus.jsonl"),
    }
    for key, path in paths.items():
        if not path.exists():
            how = (
                f"run `python -m common.tinyworld build --out {world}`"
                if not getattr(cfg, key)
                else "for the smol files: make smol"
            )
            raise FileNotFoundError(f"warmup: {key} {path} does not exist: {how}")
    return paths


def save_warmup(engine: TrainEngine, tokenizer, cfg: Any, out: Path, history: list[dict]) -> Path:
    """Write ``out/model`` (HF folder with the tokenizer), ``out/config.yaml`` and
    ``out/sft_loss.json`` on the main rank; returns ``out/model``."""
    if engine.is_main:
        (out / "model").mkdir(parents=True, exist_ok=True)
        engine.model.save_pretrained(out / "model")
        tokenizer.save_pretrained(out / "model")
        dump_config(cfg, out / "config.yaml")
        (out / "sft_loss.json").write_text(json.dumps(history))
    return out / "model"


def main(argv: list[str] | None = None) -> int:
    """The command line; a bad setting, a missing input or a bad QA file is one line and exit 2."""
    import argparse

    from common.launcher import without_local_rank

    parser = argparse.ArgumentParser(
        description="Supervised warmup on gold search paths.",
        epilog=describe_config(WarmupConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(without_local_rank(argv))
    try:
        print(run_warmup(load_config(WarmupConfig, args.config, args.overrides)))
    except (ConfigError, DataError, FileNotFoundError) as e:
        print(f"warmup: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
