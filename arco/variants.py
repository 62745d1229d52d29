"""Ablation and baseline variants of any ARCO config: ``arco/configs/variants/<name>.yaml``.

A variant file holds only the keys it changes; ``{run_dir}`` and ``{warmup_dir}`` in its strings
stand for the base config's values, so one file serves every (backbone, dataset) config:

    python -m arco train --config arco/configs/qwen3_4b_hotpotqa.yaml --variant wo_prefix

Keys given on the command line still win over the variant's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from arco.config import ArcoConfig
from common.config import load_config

VARIANTS_DIR = Path(__file__).parent / "configs" / "variants"
_NAME = re.compile(r"[A-Za-z0-9][\w-]*")  # a variant's file stem: letters, digits, _ and -


def variant_names() -> list[str]:
    return sorted(p.stem for p in VARIANTS_DIR.glob("*.yaml"))


def _flatten(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.extend(_flatten(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def variant_overrides(name: str, base: ArcoConfig) -> list[str]:
    """The variant's keys as ``key=value`` overrides, its placeholders filled from ``base``."""
    if not _NAME.fullmatch(name):  # a name, not a path: ../tiny is no variant
        raise ValueError(
            f"--variant {name!r}: not a variant name; choose one of {variant_names()} "
            f"(the files of {VARIANTS_DIR})"
        )
    path = VARIANTS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"--variant {name}: no {path}; choose one of {variant_names()}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a variant is a mapping of config keys")
    fill = {"run_dir": base.run_dir, "warmup_dir": base.warmup_dir}
    out = []
    for key, value in _flatten(data):
        if isinstance(value, str):
            try:
                value = value.format(**fill)
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(
                    f"{path}: {key}: placeholder {err} is not one of "
                    "{run_dir}, {warmup_dir} (write a literal brace as {{ or }})"
                ) from None
        out.append(f"{key}={json.dumps(value)}")
    return out


def load_variant(path: str | Path, overrides: Sequence[str], variant: str | None) -> ArcoConfig:
    """The config at ``path`` with the variant's keys (if any), then ``overrides``."""
    base = load_config(ArcoConfig, path, overrides)
    if not variant:
        return base
    return load_config(ArcoConfig, path, [*variant_overrides(variant, base), *overrides])
