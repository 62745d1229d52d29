"""ARCO's model on the paths a GPU run takes and a default CPU run skips: gradient checkpointing
under ``TrainEngine``, a bf16 base with fp32 rotary frequencies, and vLLM asleep during updates
(vLLM refuses sleep mode on a CPU, so a recording stand-in takes its place there)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from saved_tensors import saved_bytes
from test_arco_run import CONFIG, overrides

import arco.trainer
import arco.warmup
from arco.config import ArcoConfig
from arco.rubric_model import ArcoModel, build_arco_model
from arco.trainer import push_adapters
from common.config import load_config
from common.rollout.hf_engine import HFEngine
from common.train import TrainConfig, TrainEngine

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _model(tiny_world, dtype: torch.dtype = torch.float32) -> ArcoModel:
    """A tiny ArcoModel whose trained adapters are non-zero (fresh ones have B = 0)."""
    torch.manual_seed(0)  # lora_A's initialisation
    model = build_arco_model(tiny_world / "model", LORA, 3, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


def _saved_bytes_and_grads(engine: TrainEngine) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes autograd saves for backward over one π forward (logits at the masked positions) and
    one μ forward (head scores), and the gradients of their summed loss."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (2, 48), generator=g)
    mask = torch.ones_like(ids)
    with saved_bytes() as total:
        logits, _ = engine("policy", ids, mask, logit_mask=mask.bool())
        _, scores = engine("rubric", ids, mask, pool_mask=mask)
        loss = logits.float().logsumexp(-1).mean() + scores.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    return total[0], grads


def test_gradient_checkpointing_saves_activations_and_keeps_the_gradients(tiny_world):
    saved, grads = {}, {}
    for on in (False, True):
        model = _model(tiny_world)
        engine = TrainEngine(model, TrainConfig(gradient_checkpointing=on))
        assert model.training and model.lm.get_base_model().is_gradient_checkpointing == on
        saved[on], grads[on] = _saved_bytes_and_grads(engine)
    assert saved[True] < 0.6 * saved[False], saved
    assert grads[False].keys() == grads[True].keys()
    assert any(".policy." in n for n in grads[True]) and any(".rubric." in n for n in grads[True])
    assert any(n.startswith("head.") for n in grads[True])
    for name, grad in grads[False].items():
        torch.testing.assert_close(grads[True][name], grad, msg=name)


def test_a_bf16_arco_model_keeps_its_rotary_buffers_in_fp32(tiny_world):
    reference = dict(build_arco_model(tiny_world / "model", LORA, 3).named_buffers())
    model = build_arco_model(tiny_world / "model", LORA, 3, dtype=torch.bfloat16)
    rotary = [n for n in reference if n.endswith("inv_freq")]
    assert len(rotary) == 2  # inv_freq and original_inv_freq of the one rotary embedding

    def check() -> None:
        buffers = dict(model.named_buffers())
        for name in rotary:
            assert buffers[name].dtype == torch.float32, name
            assert torch.equal(buffers[name], reference[name]), name

    check()
    TrainEngine(model, TrainConfig(bf16=True))
    base = {p.dtype for n, p in model.named_parameters() if not ArcoModel.fp32_parameter(n)}
    assert base == {torch.bfloat16}
    check()
    model.to(torch.bfloat16)  # a cast of the whole module moves the rotary buffers, never casts
    check()
    model.float().bfloat16()
    check()


class SleepLog:
    """What a vLLM LoRA engine built with sleep mode is asked, in order; it refuses what a real
    one cannot do (sleep twice, wake awake, take adapters asleep)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.asleep = False

    def sleep(self) -> None:
        assert not self.asleep
        self.asleep = True
        self.log.append("sleep")

    def wake_up(self) -> None:
        assert self.asleep
        self.asleep = False
        self.log.append("wake_up")

    def push_adapter(self, name: str, lm, adapter_name: str) -> None:
        assert not self.asleep, "adapters pushed into a sleeping engine"
        self.log.append(f"push {name}")


@pytest.mark.parametrize(
    ("backend", "sleep", "naps"),
    [("vllm", True, True), ("vllm", False, False), ("hf", True, False)],
)
def test_the_engine_sleeps_through_the_update_and_wakes_before_the_push(backend, sleep, naps):
    from common.run import Run

    cfg = load_config(
        ArcoConfig, None, [f"engine.backend={backend}", f"engine.sleep_during_update={sleep}"]
    )
    engine, model = SleepLog(), SimpleNamespace(lm=None)
    run = SimpleNamespace(cfg=cfg, engine=engine, sleep_engine=engine.sleep)
    Run.nap(run)
    Run.nap(run)  # before μ's update, then before π's: one sleep
    assert engine.asleep == naps
    push_adapters(engine, model)
    push_adapters(engine, model)  # awake now: no second wake_up
    pushes = ["push policy", "push rubric"]
    assert engine.log == (["sleep", "wake_up"] if naps else []) + pushes * 2


class SleepyHF(SleepLog):
    """HF generation on the training model behind a vLLM LoRA engine's sleep interface: every
    other use (generate...) is logged by name and refused while asleep."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str):
        assert not self.asleep, f"engine.{name} while asleep"
        self.log.append(name)
        return getattr(self.inner, name)


def _logged(engines: list[SleepyHF], fn, name: str):
    """``fn``, its calls logged as ``name`` in the log of the engine in use."""

    def run(*args, **kwargs):
        engines[-1].log.append(name)
        return fn(*args, **kwargs)

    return run


@pytest.mark.slow
def test_warmup_and_rl_sleep_vllm_through_every_update(tiny_world, tmp_path, monkeypatch):
    engines: list[SleepyHF] = []

    def build_engine(cfg, model_path, model, tokenizer, seed, lora_rank=0):
        engines.append(SleepyHF(HFEngine(model, tokenizer)))
        return engines[-1]

    monkeypatch.setattr(arco.trainer, "build_engine", build_engine)
    monkeypatch.setattr(arco.warmup, "build_engine", build_engine)
    for module, name in [
        (arco.trainer, "update"),
        (arco.trainer, "rubric_update"),
        (arco.warmup, "sft_policy"),
        (arco.warmup, "sft_rubric"),
    ]:
        monkeypatch.setattr(module, name, _logged(engines, getattr(module, name), name))
    over = [
        *overrides(tiny_world, tmp_path),
        "engine.sleep_during_update=true",
        "warmup.pi_epochs=0",  # π SFT skipped, held-out EM measured once
        "eval_every=1",
    ]
    arco.warmup.run_warmup(load_config(ArcoConfig, CONFIG, over))
    arco.trainer.train_arco(load_config(ArcoConfig, CONFIG, over))
    warm, rl = (_squeeze(e.log) for e in engines)
    # warmup: play awake; the held-out evaluation (π SFT skipped); μ SFT asleep, woken for μ's
    # criteria check (rubric.mode adaptive)
    assert warm == [
        "push policy", "push rubric", "generate",  # the teacher's play
        "push policy", "push rubric", "generate", "sleep",  # select_em
        "sft_rubric", "wake_up", "push policy", "push rubric", "generate",
    ]  # fmt: skip
    # RL, 2 steps, each evaluated: rollouts (after the evaluation before them) and criteria
    # awake, μ's and π's updates asleep, woken before the new adapters go in
    step = ["generate", "sleep", "rubric_update", "update", "wake_up", "push policy", "push rubric"]
    assert rl == ["push policy", "push rubric", *step, *step, "generate"]


def _squeeze(log: list[str]) -> list[str]:
    """``log`` with each run of one entry as one."""
    return [e for i, e in enumerate(log) if i == 0 or log[i - 1] != e]
