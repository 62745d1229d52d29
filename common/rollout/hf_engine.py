"""``GenerationEngine`` on ``transformers``' ``model.generate``: the fallback and the reference."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from transformers import DynamicCache

from common.rollout.engine import Completion, GeneratedKV, SamplingConfig, stop_length
from common.train.distributed import is_multi_rank
from common.train.engine import is_partitioned


class _SampledLogprobs:
    """A logits processor that keeps one step's raw log-probs and, at the next step, the log-prob
    of the token that was sampled from them: [b] a step instead of [b, vocab].

    Custom processors run before ``generate``'s temperature and top-p warpers, so these are the
    untempered log-probs, as vLLM reports them."""

    def __init__(self) -> None:
        self.prev: torch.Tensor | None = None  # [b, V], the last step's log-probs
        self.taken: list[torch.Tensor] = []  # [b] per finished step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.taken.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = torch.log_softmax(scores.float(), -1)
        return scores

    def finish(self, new: torch.Tensor) -> torch.Tensor:
        """[b, t] log-probs of ``new`` (the generated ids [b, t])."""
        if self.prev is not None and len(self.taken) < new.shape[1]:
            self.taken.append(
                self.prev.gather(-1, new[:, len(self.taken) : len(self.taken) + 1]).squeeze(-1)
            )
        self.prev = None
        if not self.taken:
            return new.new_zeros(new.shape, dtype=torch.float)
        return torch.stack(self.taken, dim=1)


class HFEngine:
    """Generates with the training model itself; pushing weights is a no-op copy when it is shared."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 64,
        keep_kv: bool = False,
        share_prompt: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # a bar factory, total samples -> bar (``common.train.logging.generation_progress``):
        # generate advances it after each batch; None: no bar
        self.progress = None
        # share_prompt: a prompt sampled n times is prefilled once (``_prefilled_cache``)
        self.share_prompt = share_prompt
        # keep_kv: each Completion carries its batch's cache and logits (``GeneratedKV``), so
        # that a scorer of the same model can continue from the sampled tokens (CER).
        self.keep_kv = keep_kv
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _prefilled_cache(self, batch: list[list[int]], width: int) -> DynamicCache | None:
        """The cache of each row's prompt but its last token, left-padded to ``width - 1`` as
        ``_left_pad`` pads the ids (zeros where the mask is 0), each distinct prompt forwarded
        once; ``generate`` then starts from every row's last prompt token. None where no prompt
        repeats or one is a single token (nothing to gain or to cache)."""
        distinct: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for prompt in batch:
            distinct.setdefault(tuple(prompt), [])
        if len(distinct) == len(batch) or min(len(p) for p in distinct) < 2:
            return None
        for prompt in distinct:
            ids = torch.tensor([prompt[:-1]], device=self.device)
            cache = self.model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
            distinct[prompt] = [(layer.keys, layer.values) for layer in cache.layers]
        layers = []
        for i in range(len(next(iter(distinct.values())))):
            k0, v0 = distinct[tuple(batch[0])][i]
            keys = k0.new_zeros((len(batch), k0.shape[1], width - 1, k0.shape[3]))
            values = v0.new_zeros((len(batch), v0.shape[1], width - 1, v0.shape[3]))
            for row, prompt in enumerate(batch):
                k, v = distinct[tuple(prompt)][i]
                keys[row, :, width - len(prompt) :] = k[0]
                values[row, :, width - len(prompt) :] = v[0]
            layers.append((keys, values))
        return DynamicCache(ddp_cache_data=layers)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingConfig, adapter: str | None = None
    ) -> list[list[Completion]]:
        if adapter is not None:
            self.model.set_adapter(adapter)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        flat = [p for p in prompts for _ in range(params.n)]
        comps: list[Completion] = []
        stop_ids = self.eos_ids | set(params.stop_token_ids)
        was_training = self.model.training
        self.model.eval()
        # ZeRO-3: every forward gathers each layer's weights from all ranks, so a rank whose rows
        # all stopped must keep forwarding until every rank's have (transformers takes this from
        # a DeepSpeed config that load_for_training no longer holds; without it the others hang)
        synced = is_partitioned(self.model) and is_multi_rank()
        bar = self.progress(len(flat)) if self.progress is not None else None
        for start in range(0, len(flat), self.batch_size):
            batch = flat[start : start + self.batch_size]
            ids, mask = self._left_pad(batch)
            greedy = params.temperature == 0
            prefilled = self._prefilled_cache(batch, ids.shape[1]) if self.share_prompt else None
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                past_key_values=prefilled,
                do_sample=not greedy,
                temperature=None if greedy else params.temperature,
                top_p=None if greedy else params.top_p,
                top_k=params.top_k if params.top_k > 0 and not greedy else None,
                max_new_tokens=params.max_tokens,
                eos_token_id=sorted(stop_ids) or None,
                pad_token_id=self.pad_id,
                stop_strings=list(params.stop) or None,
                tokenizer=self.tokenizer if params.stop else None,
                # the whole [b, t, V] logits only where a scorer continues from them (keep_kv);
                # else each step's sampled log-prob is taken as it goes (at paper lengths the
                # full logits of a batch are hundreds of GB)
                output_logits=self.keep_kv,
                logits_processor=None if self.keep_kv else [recorder := _SampledLogprobs()],
                return_dict_in_generate=True,
                synced_gpus=synced or None,  # None: transformers decides (FSDP)
            )
            new = out.sequences[:, ids.shape[1] :]  # [b, t]
            # logprobs of the sampled ids under the raw (untempered) distribution, as vLLM reports
            if self.keep_kv:
                logits = torch.stack(out.logits, dim=1).float()  # [b, t, V]
                lps = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
            else:
                logits, lps = None, recorder.finish(new)
            layers = (
                [(layer.keys, layer.values) for layer in out.past_key_values.layers]
                if self.keep_kv
                else None
            )
            for b, (row, row_lp) in enumerate(zip(new.tolist(), lps.tolist(), strict=True)):
                n, stopped = stop_length(row, self._piece, params.stop, stop_ids)
                toks = row[:n]
                comps.append(
                    Completion(
                        toks,
                        row_lp[:n],
                        self.tokenizer.decode(toks, skip_special_tokens=False),
                        "stop" if stopped else "length",
                        kv=None if layers is None else GeneratedKV(layers, b, mask[b], logits),
                    )
                )
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.close()
        self.model.train(was_training)
        return [comps[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    def _piece(self, tok: int) -> str:
        return self.tokenizer.decode([tok], skip_special_tokens=False)

    @torch.no_grad()
    def score(
        self, prefixes: list[list[int]], continuations: list[list[int]], adapter: str | None = None
    ) -> list[list[float]]:
        if adapter is not None:
            self.model.set_adapter(adapter)
        scores = []
        was_training = self.model.training  # a training model: no dropout in its scores
        self.model.eval()
        for p, c in zip(prefixes, continuations, strict=True):
            if not p:
                raise ValueError("score: every prefix needs at least one token")
            ids = torch.tensor([list(p) + list(c)], device=self.device)
            logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), -1)
            targets = ids[0, 1:]
            tok_lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            scores.append(tok_lp[len(p) - 1 :].tolist())
        self.model.train(was_training)
        return scores

    def push_weights(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights in; a no-op in effect when the engine shares the training model."""
        missing, unexpected = self.model.load_state_dict(dict(named_weights), strict=False)
        if unexpected:
            raise KeyError(f"push_weights: names the model does not have: {unexpected[:5]}")
