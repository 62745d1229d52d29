"""The `arco` command: ``python -m arco {warmup,train,eval,diagnose} [--config FILE] [key=value ...]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from arco.config import ArcoConfig
from arco.variants import load_variant
from common.config import ConfigError, describe_config
from common.launcher import run_command, without_local_rank

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "tiny.yaml")
HELPS = {
    "warmup": "teacher trajectories, hindsight annotation, projection, π SFT and μ SFT",
    "train": "co-evolution RL of π and μ (sparse phase, then dense phase) from warmup_dir",
    "eval": "greedy EM/F1 of the latest checkpoint's policy on assets.eval (or dev)",
    "diagnose": "μ's rubrics: action identification against chance, step scores per bucket for "
    "correct and wrong trajectories (table and plot)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="arco",
        description="ARCO: a rubric model on the policy's backbone, co-evolving with it.",
        epilog="overrides: dotted key=value, e.g. rl.dense_steps=10 rubric.k=3\n\n"
        + describe_config(ArcoConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in HELPS.items():
        p = sub.add_parser(
            name,
            help=text,
            description=text,
            epilog=parser.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--config", default=DEFAULT_CONFIG, help=f"YAML (default {DEFAULT_CONFIG})")
        p.add_argument(
            "--variant",
            default=None,
            help="an ablation or baseline from arco/configs/variants/ (e.g. prm, wo_prefix) "
            "applied to the config; its run_dir and warmup_dir follow the config's",
        )
        p.add_argument("overrides", nargs="*", help="dotted key=value")
        if name == "diagnose":
            p.add_argument(
                "--checkpoint",
                default=None,
                help="an ARCO folder (checkpoints/step_N or warmup_dir); default: the latest "
                "checkpoint of run_dir, else warmup_dir",
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(without_local_rank(argv))
    try:
        cfg = load_variant(args.config, args.overrides, args.variant)
        if args.command == "warmup":
            from arco.warmup import run_warmup

            print(f"warmup written to {run_warmup(cfg)}")
        elif args.command == "train":
            from arco.trainer import train_arco
            from common.rl_loop import result_line

            print(result_line(train_arco(cfg)))
        elif args.command == "diagnose":
            from arco.diagnose import run_diagnose

            out = run_diagnose(cfg, args.checkpoint)
            print(out["table"] + f"written to {out['out']}")
        else:
            from arco.evaluate import run_eval

            print(run_eval(cfg)["table"])
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"arco {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


def run() -> NoReturn:
    """The console script ``arco`` and ``python -m arco``."""
    run_command(main)
