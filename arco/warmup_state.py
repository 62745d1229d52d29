"""What ``arco train`` requires of the warmup it starts from: a finished one (its
``phases/mu.done``, written by ``arco.warmup.WarmupPhases``) made with this run's RL settings
(``warmup_rl_settings``). Apart from ``arco.warmup`` so that the trainer imports it without the
warmup's (which imports the trainer's engine builders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arco.config import ArcoConfig
from common.config import config_to_dict
from common.train.run_folder import config_diff

# what RL reads of the warmup beside the rubric (``arco.trainer.check_rubric_matches``): the
# backbone and LoRA its adapters belong to, and the environment and prompt format π and μ learned
WARMUP_FOR_RL = {
    "assets": ("model",),
    "lora": None,  # every key
    "env": None,
    "agent": ("instruction", "state_budget"),  # env's protocol replaces agent.protocol
}


def warmup_rl_settings(cfg: ArcoConfig) -> dict:
    """The settings an RL run must share with the warmup it starts from (``WARMUP_FOR_RL``);
    the warmup's own (``warmup.*``, its seed, its questions) may differ."""
    full = config_to_dict(cfg)
    out = {}
    for section, keys in WARMUP_FOR_RL.items():
        values = full.get(section, {})
        out[section] = dict(values) if keys is None else {k: values.get(k) for k in keys}
    return json.loads(json.dumps(out, default=str))


def check_warmup_finished(cfg: ArcoConfig) -> None:
    """Before RL loads anything: ``warmup_dir`` holds a finished warmup (its ``phases/mu.done``)
    made with this run's RL settings (``warmup_rl_settings``); else a ``ValueError`` in one
    line naming the folder and what differs."""
    out = Path(cfg.warmup_dir)
    marker = out / "phases" / "mu.done"
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        saved = record.get("rl_settings")
    except (OSError, ValueError, AttributeError):
        raise ValueError(
            f"warmup_dir {out} holds no finished warmup (no {marker}: a warmup killed, or rerun "
            "under other settings and stopped, before μ's phase ended, or one written before "
            "the marker; its adapters may be an older warmup's): run `arco warmup` with this "
            "config to finish it (its finished phases are skipped)"
        ) from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"warmup_dir {out}: {marker} records no RL settings (a warmup written before "
            "them): run `arco warmup` again with the settings it was made with (its phases are "
            "done: it only records them)"
        )
    changes = config_diff(saved, warmup_rl_settings(cfg))
    if changes:

        def show(v: Any) -> str:
            text = json.dumps(v, default=repr)
            return text if len(text) <= 60 else text[:57] + "..."

        what = ", ".join(f"{k}: {show(old)} -> {show(new)}" for k, old, new in changes)
        raise ValueError(
            f"warmup_dir {out} was made with other settings than this run's ({marker}; "
            f"warmup -> run): {what}; run `arco warmup` with this run's settings, or set "
            "warmup_dir to a warmup made with them"
        )
