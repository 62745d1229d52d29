"""``python -m experiments.rehearse --config <paper config> [--variant NAME] [--ranks N]``, or ``--all``.

Runs the config's whole pipeline on this machine with stand-ins (see ``experiments.rehearse.runner``)
and writes ``runs/rehearse/<config>/report.md`` and ``report.json``. Exit status 1 when a stage
fails (the stage is named), 2 when the rehearsal could not be set up.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common.config import ConfigError
from experiments.rehearse.runner import (
    ARCO_VARIANT_CONFIG,
    PAPER_CONFIGS,
    ROOT,
    RehearsalError,
    rehearse,
)


def arco_variants() -> list[str]:
    return sorted(p.stem for p in (ROOT / "arco" / "configs" / "variants").glob("*.yaml"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.rehearse",
        description="Rehearse a paper config end to end on this machine with a shrunken stand-in "
        "model, stand-in data, retrieval and endpoints.",
    )
    p.add_argument("--config", help="a paper config, e.g. eviback/configs/qwen3_1.7b.yaml")
    p.add_argument("--variant", help="an ARCO variant (arco/configs/variants/NAME.yaml)")
    p.add_argument("--ranks", type=int, default=1, help="ranks under the DeepSpeed launcher")
    p.add_argument("--out", help="output folder (default runs/rehearse/<config>[-variant])")
    p.add_argument("--stage", action="append", help="run only these stages (repeatable)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE:KEY=VALUE",
        help="one more override for one stage (repeatable), e.g. train:steps=5",
    )
    p.add_argument(
        "--all", action="store_true", help="every paper config and ARCO variant, one after another"
    )
    return p


def _extra(items: list[str]) -> dict[str, list[str]]:
    extra: dict[str, list[str]] = {}
    for item in items:
        stage, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise RehearsalError(f"--set {item!r}: expected STAGE:KEY=VALUE")
        extra.setdefault(stage, []).append(override)
    return extra


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        extra = _extra(args.set)
        if args.all:
            jobs = [(c, None) for c in PAPER_CONFIGS]
            jobs += [(ARCO_VARIANT_CONFIG, v) for v in arco_variants()]
        elif args.config:
            jobs = [(args.config, args.variant)]
        else:
            raise RehearsalError("give --config <paper config> or --all")
        failed = []
        t0 = time.perf_counter()
        for config, variant in jobs:
            out = Path(args.out) if args.out and not args.all else None
            report = rehearse(config, variant, args.ranks, out, extra, args.stage)
            label = config + (f" --variant {variant}" if variant else "")
            if report.ok:
                print(f"[rehearse] {label}: passed in {report.seconds:.0f} s")
            else:
                failed.append(f"{label} ({', '.join(report.failed)})")
                print(f"[rehearse] {label}: FAILED at {', '.join(report.failed)}", file=sys.stderr)
        if len(jobs) > 1:
            print(
                f"[rehearse] {len(jobs) - len(failed)} of {len(jobs)} passed in "
                f"{time.perf_counter() - t0:.0f} s"
            )
        if failed:
            print("[rehearse] failed: " + "; ".join(failed), file=sys.stderr)
            return 1
        return 0
    except (RehearsalError, ConfigError) as e:  # a config that is not there or does not load
        print(f"rehearse: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
