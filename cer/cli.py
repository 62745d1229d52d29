"""The `cer` command (or ``python -m cer``): ``cer {build-tiny,warmup,train,eval}``.

    python -m cer build-tiny --out runs/cer/tiny/task [--seed 0] [--task alias|arithmetic]
                                                    [--worlds shared|fresh]
    python -m cer warmup --config cer/configs/tiny.yaml [key=value ...]
    python -m cer train  --config cer/configs/tiny.yaml [reward.type=exact run_dir=...]
    python -m cer eval   --config cer/configs/tiny.yaml [--model PATH]

Overrides are dotted ``key=value`` pairs (see ``python -m cer train --help`` for every key).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from cer.config import CERConfig, MissingAssetError
from cer.tasks.alias import (
    CANONICAL_SHARE_HELP,
    DEFAULT_NAME_HOLDOUT,
    DEFAULT_WORLDS,
    NAME_HOLDOUT_HELP,
    NAME_HOLDOUTS,
    WORLDS,
    WORLDS_HELP,
)
from common.config import ConfigError, describe_config, load_config
from common.data import DataError
from common.launcher import run_command, without_local_rank

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "tiny.yaml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cer",
        description="CER: RL with the conditional expectation reward (tiny task, warmup, "
        "training, evaluation).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-tiny", help="write the tiny task, tokenizer and model")
    b.add_argument("--out", default="runs/cer/tiny/task", help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--n-train",
        type=int,
        default=None,
        help="train problems (default: 13000 alias shared-names, else 2000)",
    )
    b.add_argument("--n-dev", type=int, default=200)
    b.add_argument("--n-test", type=int, default=200)
    b.add_argument(
        "--task",
        choices=("alias", "arithmetic"),
        default="alias",
        help="alias: reading comprehension with name/number aliases (cer.tasks.alias); "
        "arithmetic: numbers in several forms (cer.tasks.arithmetic)",
    )
    b.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="tokenizer ids (default: alias 2048 with --worlds shared-names or shared, 512 with fresh; "
        "arithmetic 1024)",
    )
    b.add_argument(
        "--worlds",
        choices=WORLDS,
        default=None,
        help=f"alias task only (default {DEFAULT_WORLDS}): {WORLDS_HELP}",
    )
    b.add_argument(
        "--name-holdout",
        choices=NAME_HOLDOUTS,
        default=DEFAULT_NAME_HOLDOUT,
        help=NAME_HOLDOUT_HELP,
    )
    b.add_argument(
        "--canonical-share",
        type=float,
        default=None,
        help=f"alias task only: {CANONICAL_SHARE_HELP}",
    )
    b.add_argument(
        "--isolate-spaces",
        action="store_true",
        help="a space is a token of its own, so a name has the same ids in the context and in "
        "\\boxed{} (measured: no gain on the alias warmup; README)",
    )
    helps = {
        "warmup": "supervised warmup on worked solutions",
        "train": "RL with the configured reward",
        "eval": "avg@k and greedy accuracy on the benchmarks",
    }
    for name, text in helps.items():
        p = sub.add_parser(
            name,
            help=text,
            epilog="overrides: dotted key=value\n\n" + describe_config(CERConfig),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config")
        if name == "eval":
            p.add_argument(
                "--model", default=None, help="model folder (default: latest checkpoint)"
            )
        p.add_argument("overrides", nargs="*")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(without_local_rank(argv))
    try:
        if args.command == "build-tiny":
            from cer.tasks.build import build_tiny

            out = build_tiny(
                args.out,
                args.seed,
                args.n_train,
                args.n_dev,
                args.n_test,
                args.vocab_size,
                args.task,
                args.isolate_spaces,
                args.worlds,
                args.name_holdout,
                args.canonical_share,
            )
            print(f"wrote the tiny CER {args.task} task, tokenizer and model to {out}")
            return 0
        cfg = load_config(CERConfig, args.config, args.overrides)
        if cfg.torch_threads:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        if args.command == "warmup":
            from cer.warmup import run_warmup

            print(run_warmup(cfg))
        elif args.command == "train":
            from cer.trainer import train_cer

            out = train_cer(cfg)
            b, a = out["before"], out["after"]
            if b is None:
                print(f"no dev evaluation (eval_every=0); {out['run_dir']}")
            else:
                print(f"dev accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f}; {out['run_dir']}")
        else:
            from cer.evaluate import run_eval

            run_eval(cfg, args.model)
    except (ConfigError, MissingAssetError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def run() -> NoReturn:
    """The console script ``cer`` and ``python -m cer``."""
    run_command(main)
