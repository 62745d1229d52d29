"""The `eviback` command: ``python -m eviback {warmup,train,eval,ape} [--config FILE] [key=value ...]``.

``eval --compare A B`` compares two runs' ``per_question.jsonl`` files by paired bootstrap
without loading a model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from common.config import ConfigError, describe_config, load_config
from common.launcher import run_command, without_local_rank
from eviback.config import EviBackConfig

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "tiny.yaml")
WARMUP_CONFIG = str(Path(__file__).parents[1] / "common" / "configs" / "warmup_tiny.yaml")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eviback",
        description="EviBack: search-agent GRPO with evidence-constrained teacher backoff.",
        epilog="overrides: dotted key=value, e.g. steps=20 teacher.enabled=false\n\n"
        + describe_config(EviBackConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {
        "warmup": "supervised warmup on gold search paths (common.warmup; tiny world)",
        "train": "GRPO with the teacher backoff (teacher.enabled=false: Search-R1 GRPO)",
        "eval": "evaluate on assets.eval; JSON + markdown in run_dir/eval/",
        "ape": "E2E-APE: build the teacher's frozen two-stage prompt policy",
    }
    for name, text in helps.items():
        p = sub.add_parser(name, help=text, description=text)
        default = WARMUP_CONFIG if name == "warmup" else DEFAULT_CONFIG
        p.add_argument("--config", default=default, help=f"YAML config (default {default})")
        p.add_argument("overrides", nargs="*", help="dotted key=value")
        if name == "eval":
            p.add_argument(
                "--compare",
                nargs=2,
                metavar=("BASE", "NEW"),
                help="paired bootstrap of two per_question.jsonl files (NEW − BASE), no model",
            )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(without_local_rank(argv))
    try:
        return _run(args)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"eviback {args.command}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "warmup":
        from common.warmup import WarmupConfig, run_warmup

        print(run_warmup(load_config(WarmupConfig, args.config, args.overrides)))
        return 0
    if args.command == "eval" and args.compare:
        from eviback.evaluate import compare, markdown_table, read_results, summarize_by_benchmark

        base, new = (read_results(p) for p in args.compare)
        print(markdown_table(summarize_by_benchmark(new), compare(new, base, 10_000, 0.95)))
        return 0
    cfg = load_config(EviBackConfig, args.config, args.overrides)
    if args.command == "train":
        from common.rl_loop import result_line
        from eviback.trainer import train_eviback

        print(result_line(train_eviback(cfg)))
    elif args.command == "eval":
        from eviback.evaluate import markdown_table, run_eval

        report = run_eval(cfg)
        if "summary" in report:  # rank 0 (the others only ran their shard)
            print(markdown_table(report["summary"], report["comparisons"]))
    else:
        from eviback.ape_run import run_ape

        out = run_ape(cfg)
        print(f"policy: {out['policy_file']}; report: {out['out']}/report.md")
    return 0


def run() -> NoReturn:
    """The console script ``eviback`` and ``python -m eviback``."""
    run_command(main)
