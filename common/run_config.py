"""The settings every RL run shares, one vocabulary for all four trainers (the reference GRPO
loop, ARCO, CER, EviBack); docs/configuration.md has the table.

* ``AssetsConfig`` and its two extensions: the external inputs (``assets.model``,
  ``assets.train``, ``assets.dev``; ``assets.eval`` for a method's ``eval`` command;
  ``assets.corpus`` and ``assets.retrieval_url`` for a search agent). A method's ``assets``
  section extends them with its own inputs and overrides a default where it differs.
* ``RunLoopConfig``: the run loop (``run_dir``, ``resume``, ``seed``, ``steps``, the
  evaluation and checkpoint schedule, the ``engine``, ``train`` and ``log`` sections), inherited
  by every run config class; ``SearchRunConfig`` adds the search agent's group batch
  (``questions_per_step``, ``n``, ``agent``, ``loss``).

This module loads no torch, transformers, peft or vLLM: a command line's ``--help`` and a
config error answer at once (tests/test_cli_fast.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from common.rollout.agent import AgentConfig
from common.train.config import TrainConfig


@dataclass
class AssetsConfig:
    """The inputs every run reads: the model and the training and dev questions."""

    model: str = field(default="", metadata={"help": "policy to train: HF folder or hub id"})
    train: str = field(default="", metadata={"help": "training questions (a QA file)"})
    dev: str = field(
        default="", metadata={"help": "dev questions, evaluated during training (a QA file)"}
    )
    sources: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "where `make data` gets each data file: asset key (train, dev, eval.NAME, "
            "train.NAME) -> hf://owner/name[:config]@split or hf-file://owner/name/path"
        },
    )


@dataclass
class EvalAssetsConfig(AssetsConfig):
    """``AssetsConfig`` plus the benchmarks of a method's ``eval`` command."""

    eval: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "benchmark name -> QA file, for the method's `eval` command"},
    )


@dataclass
class SearchAssetsConfig(AssetsConfig):
    """``AssetsConfig`` plus a search agent's retrieval: a corpus, or a retrieval server."""

    corpus: str = field(
        default="", metadata={"help": "corpus jsonl (BM25 in process) or an index folder"}
    )
    retrieval_url: str = field(
        default="",
        metadata={"help": "a Search-R1 /retrieve server (replaces corpus when set)"},
    )
    retrieval_max_wait_s: float = field(
        default=300.0,
        metadata={
            "help": "seconds the run waits for a retrieval server that stopped answering before "
            "it stops in one line (a restart takes 13-22 s)",
            "gt": 0,
        },
    )


@dataclass
class EngineConfig:
    """The rollout engine."""

    backend: Literal["vllm", "hf"] = field(default="vllm", metadata={"help": "vllm | hf"})
    max_model_len: int = field(default=1024, metadata={"help": "engine context length", "ge": 1})
    kv_cache_mib: int = field(default=128, metadata={"help": "KV cache size on CPU (MiB)", "ge": 1})
    gpu_memory_utilization: float = field(
        default=0.4, metadata={"help": "GPU share for vLLM", "gt": 0, "le": 1}
    )
    sleep_during_update: bool = field(
        default=False, metadata={"help": "free vLLM's GPU memory during the update (GPU only)"}
    )
    share_prompt: bool = field(
        default=False,
        metadata={
            "help": "HF engine: prefill a prompt sampled n times once and start its n samples "
            "from that cache (vLLM does so itself, by its prefix cache)"
        },
    )
    max_num_seqs: int = field(
        default=0,
        metadata={
            "help": "vLLM's most sequences in one batch; 0: vLLM's default (set it to the "
            "rollouts a rank holds: its defaults profile for more, and leave less KV cache)",
            "ge": 0,
        },
    )
    max_num_batched_tokens: int = field(
        default=0,
        metadata={"help": "vLLM's most tokens in one forward; 0: vLLM's default", "ge": 0},
    )


@dataclass
class LossConfig:
    """The clipped policy loss."""

    eps_low: float = field(default=0.2, metadata={"help": "lower clip range", "ge": 0, "lt": 1})
    eps_high: float = field(
        default=0.2, metadata={"help": "upper clip range (DAPO: 0.28)", "ge": 0}
    )
    aggregation: Literal[
        "seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
    ] = field(
        default="seq_mean_token_mean",
        metadata={
            "help": "seq_mean_token_mean | token_mean | seq_mean_token_sum | seq_mean_token_sum_norm"
        },
    )
    kl_coef: float = field(
        default=0.0, metadata={"help": "k3 KL penalty weight (0 = no reference)", "ge": 0}
    )
    micro_batch_size: int = field(
        default=16, metadata={"help": "trajectories per backward", "ge": 1}
    )
    logprob_chunk: int = field(
        default=1024,
        metadata={"help": "positions whose [chunk, vocab] logits exist at a time", "ge": 1},
    )
    skip_zero_advantage: bool = field(
        default=True,
        metadata={
            "help": "leave a micro-batch's rows whose every advantage is 0 out of its forward "
            "(their gradient is exactly 0; the loss keeps the micro-batch's denominators); "
            "no effect with a KL term"
        },
    )
    share_prompt: bool = field(
        default=False,
        metadata={
            "help": "forward a prompt once for all its responses in a micro-batch (a group's); "
            "needs train.gradient_checkpointing=false and not ZeRO-3 on several ranks"
        },
    )


@dataclass
class LogConfig:
    """Experiment tracking beside metrics.jsonl (the `log` section of every trainer's config)."""

    tensorboard: bool = field(
        default=False,
        metadata={"help": "also write TensorBoard events to <run_dir>/tensorboard"},
    )
    wandb_project: str = field(
        default="", metadata={"help": "also log to this W&B project ('' = off; needs wandb)"}
    )
    wandb_mode: Literal["offline", "online"] = field(
        default="offline",
        metadata={"help": "offline: W&B files under <run_dir>/wandb, no network (`wandb sync`)"},
    )


@dataclass
class RunLoopConfig:
    """The run loop's settings, the same in every RL run (the reference GRPO loop, ARCO, CER,
    EviBack): a run's config class inherits them, so they are declared here once. A method whose
    default differs redeclares the field with its own default (same type and range)."""

    run_dir: str = field(default="runs/run", metadata={"help": "output folder"})
    resume: bool = field(
        default=True,
        metadata={
            "help": "continue from run_dir's latest checkpoint (false: start at step 0, "
            "replace the run)"
        },
    )
    allow_config_change: bool = field(
        default=False,
        metadata={
            "help": "continue or rerun run_dir under other settings (recorded in "
            "config_changes.jsonl; a changed lr, weight decay, betas or eps is applied to the "
            "restored optimizer) or with edited data files (recorded in data_files.json)"
        },
    )
    seed: int = field(default=0, metadata={"help": "data order and sampling seed", "ge": 0})
    steps: int = field(default=40, metadata={"help": "RL steps (one optimizer step each)", "ge": 1})
    eval_every: int = field(
        default=10,
        metadata={
            "help": "dev evaluation every k steps, before training and at the last step (0: never)",
            "ge": 0,
        },
    )
    eval_questions: int = field(default=100, metadata={"help": "dev questions evaluated", "ge": 1})
    save_every: int = field(
        default=0, metadata={"help": "checkpoint every k steps (0: at the last step only)", "ge": 0}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "checkpoints kept", "ge": 1})
    samples_per_step: int = field(
        default=4, metadata={"help": "rollouts written to samples/ each step", "ge": 0}
    )
    max_nonfinite_in_a_row: int = field(
        default=3,
        metadata={
            "help": "stop the run after this many steps in a row whose update was skipped for a "
            "non-finite reward, advantage, loss or gradient norm (0: never stop)",
            "ge": 0,
        },
    )
    max_identical_groups_in_a_row: int = field(
        default=5,
        metadata={
            "help": "stop the run after this many steps in a row whose every group's rollouts "
            "were token-identical (identical_group_share 1.0: no advantage to learn from; one "
            "seed for a group's requests on a GPU does it); a step with one rollout a question "
            "does not count (0: never stop)",
            "ge": 0,
        },
    )
    logprob_gap_limit: float = field(
        default=0.1,
        metadata={
            "help": "the most logprob_gap (mean |log pi_train - log pi_engine| over sampled "
            "tokens) a healthy step shows: bf16 rollouts a few hundredths, CPU ~1e-5",
            "gt": 0,
        },
    )
    max_logprob_gap_in_a_row: int = field(
        default=3,
        metadata={
            "help": "stop the run after this many steps in a row whose logprob_gap is over "
            "logprob_gap_limit (the engine samples from another model than the one trained); a "
            "NaN gap (nothing forwarded) neither counts nor resets the streak (0: never stop)",
            "ge": 0,
        },
    )
    min_sleep_freed_share: float = field(
        default=0.5,
        metadata={
            "help": "GPU, engine.sleep_during_update: stop the run when vLLM's sleep frees less "
            "device memory than this share of what the memory plan has it free "
            "(engine.gpu_memory_utilization x the GPU, less 1 GiB kept asleep) (0: never stop)",
            "ge": 0,
            "le": 1,
        },
    )
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    log: LogConfig = field(default_factory=LogConfig)


@dataclass
class SearchRunConfig(RunLoopConfig):
    """``RunLoopConfig`` plus the search agent's group batch, for the GRPO-family search runs
    (the reference GRPO loop, EviBack)."""

    questions_per_step: int = field(
        default=8,
        metadata={
            "help": "questions per step over all ranks (global, as verl's data.train_batch_size; "
            "each rank takes its share)",
            "ge": 1,
        },
    )
    n: int = field(default=8, metadata={"help": "rollouts per question (group size)", "ge": 1})
    agent: AgentConfig = field(default_factory=AgentConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        if (self.questions_per_step * self.n) % self.loss.micro_batch_size:
            raise ValueError(
                f"questions_per_step*n = {self.questions_per_step * self.n} is not a multiple of "
                f"loss.micro_batch_size = {self.loss.micro_batch_size}"
            )

    def set_grad_accum(self) -> None:
        """``train.grad_accum`` for this launch's ranks: each rank's share of the global
        questions times ``n``, over ``loss.micro_batch_size`` (``common.batches``; one
        ``ConfigError`` line when either does not divide). Run it before any load."""
        from common.batches import group_grad_accum

        self.train.grad_accum = group_grad_accum(
            self.questions_per_step,
            "questions_per_step",
            self.n,
            "n",
            self.loss.micro_batch_size,
            "loss.micro_batch_size",
        )
