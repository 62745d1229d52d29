"""`python -m common.tinyworld build --out DIR --seed N [sizes]` and `show --dir DIR`."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from common.tinyworld.build import build_world, describe
from common.tinyworld.model_sizes import DEFAULT_MODEL_SIZES
from common.tinyworld.questions import SplitSizes
from common.tinyworld.world import WorldSizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tinyworld", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="generate a tiny world folder")
    build.add_argument(
        "--out", required=True, help="folder to write (replaced if an earlier build)"
    )
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--vocab-size", type=int, default=2048, help="tokenizer ids in all")
    build.add_argument(
        "--split-digits",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="every digit a token of its own, as in Qwen's tokenizer (measured: no better here)",
    )
    build.add_argument(
        "--rename-seed",
        type=int,
        default=None,
        help="permute the names within each kind (seed N): the same names and structure, every "
        "named fact new (a model trained on --seed's world must search instead of recall)",
    )
    for sizes in (WorldSizes(), SplitSizes()):
        for field in dataclasses.fields(sizes):
            default = getattr(sizes, field.name)
            build.add_argument(f"--{field.name}", type=type(default), default=default)
    for name, default in DEFAULT_MODEL_SIZES.items():
        build.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    show = commands.add_parser("show", help="print counts and example questions of a built world")
    show.add_argument("--dir", required=True)
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            build_world(
                args.out,
                seed=args.seed,
                sizes=WorldSizes(
                    **{f.name: getattr(args, f.name) for f in dataclasses.fields(WorldSizes)}
                ),
                splits=SplitSizes(
                    **{f.name: getattr(args, f.name) for f in dataclasses.fields(SplitSizes)}
                ),
                vocab_size=args.vocab_size,
                model_sizes={k: getattr(args, k) for k in DEFAULT_MODEL_SIZES},
                split_digits=args.split_digits,
                rename_seed=args.rename_seed,
            )
        else:
            print(describe(args.dir))
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
