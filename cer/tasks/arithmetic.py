"""The tiny CER task: seeded small reasoning problems whose answers have several correct forms.

Kinds: integer arithmetic, fraction sums, decimal sums, unit conversions, percentages and short
word problems. Every answer is a number, and each problem lists its correct surface forms
(``\\frac{3}{4}``, ``3/4``, ``0.75``; ``2500``, ``2500.0``, ``2500\\text{ m}``; ``20\\%``, ``20``);
the first is the canonical answer. The supervised warmup set gives each train problem a short
worked solution that ends in ``\\boxed{<a random correct form>}``: exact match against the
canonical string rejects many right answers, the rule verifier accepts them, so the gap between
the rewards is visible on a model small enough for a CPU.

    python -m cer.tasks.arithmetic build --out DIR --seed N [--n-train 2000 --n-dev 200 --n-test 200]

writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (``id, kind, problem, answer,
answer_forms``), ``warmup.jsonl`` (``id, problem, solution, answer``) and ``meta.json``. Same
seed and sizes, same bytes. The splits share no problem text.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path


@dataclass(frozen=True)
class TinyProblem:
    kind: str
    problem: str
    forms: tuple[str, ...]  # correct surface forms of the answer; forms[0] is canonical
    steps: str  # the worked solution before the boxed answer


def decimal_text(x: Fraction) -> str | None:
    """``x`` as a finite decimal without trailing zeros (``"0.75"``, ``"12"``), or None when its
    decimal expansion does not terminate."""
    d = x.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return None
    text = format(Decimal(x.numerator) / Decimal(x.denominator), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def number_forms(x: Fraction, unit: str = "") -> tuple[str, ...]:
    """Correct forms of a number: an integer as ``12``, ``12.0``; a finite decimal as ``0.75``,
    ``\\frac{3}{4}``, ``3/4``, ``0.750``; any other fraction as ``\\frac{1}{3}``, ``1/3``,
    ``\\dfrac{1}{3}``. With ``unit``, the first form followed by ``\\text{ unit}`` too."""
    dec = decimal_text(x)
    frac, slash = f"\\frac{{{x.numerator}}}{{{x.denominator}}}", f"{x.numerator}/{x.denominator}"
    if x.denominator == 1:
        forms = (str(x.numerator), f"{x.numerator}.0")
    elif dec is not None:
        forms = (dec, frac, slash, dec + "0")
    else:
        forms = (frac, slash, f"\\dfrac{{{x.numerator}}}{{{x.denominator}}}")
    return forms + ((f"{forms[0]}\\text{{ {unit}}}",) if unit else ())


def _arithmetic(rng: random.Random) -> TinyProblem:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    op = rng.choice("+-*")
    if op == "-" and b > a:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    shown = "\\times" if op == "*" else op
    return TinyProblem(
        "arithmetic",
        f"What is {a} {shown} {b}?",
        number_forms(Fraction(value)),
        f"{a} {shown} {b} = {value}.",
    )


def _fraction_sum(rng: random.Random) -> TinyProblem:
    b, d = rng.choice((2, 3, 4, 5, 6, 8, 10)), rng.choice((2, 3, 4, 5, 6, 8, 10))
    a, c = rng.randint(1, b - 1), rng.randint(1, d - 1)
    total = Fraction(a, b) + Fraction(c, d)
    common = b * d
    return TinyProblem(
        "fraction",
        f"What is {a}/{b} + {c}/{d}?",
        number_forms(total),
        f"{a}/{b} + {c}/{d} = {a * d}/{common} + {c * b}/{common} = {a * d + c * b}/{common}, "
        f"which is {total}.",
    )


def _decimal_sum(rng: random.Random) -> TinyProblem:
    x, y = Fraction(rng.randint(1, 40), 4), Fraction(rng.randint(1, 40), 10)
    total = x + y
    return TinyProblem(
        "decimal",
        f"What is {decimal_text(x)} + {decimal_text(y)}?",
        number_forms(total),
        f"{decimal_text(x)} + {decimal_text(y)} = {decimal_text(total)}.",
    )


# (bigger unit, smaller unit, how many smaller in one bigger)
_UNITS = (
    ("km", "m", 1000),
    ("kg", "g", 1000),
    ("m", "cm", 100),
    ("L", "mL", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
)


def _unit_conversion(rng: random.Random) -> TinyProblem:
    big, small, factor = rng.choice(_UNITS)
    if rng.random() < 0.5:
        amount = Fraction(rng.randint(1, 60), 2)
        value = amount * factor
        question, unit = f"How many {small} are in {decimal_text(amount)} {big}?", small
        steps = f"One {big.rstrip('s')} is {factor} {small}, so {decimal_text(amount)} x {factor}"
    else:
        amount = Fraction(factor * rng.randint(1, 40), 4)
        value = amount / factor
        question, unit = f"How many {big} are in {decimal_text(amount)} {small}?", big
        steps = f"One {big.rstrip('s')} is {factor} {small}, so {decimal_text(amount)} / {factor}"
    return TinyProblem(
        "units", question, number_forms(value, unit), f"{steps} = {decimal_text(value)}."
    )


def _percentage(rng: random.Random) -> TinyProblem:
    whole = rng.randrange(10, 210, 10)
    percent = rng.choice((5, 10, 20, 25, 50, 75))
    part = Fraction(whole * percent, 100)
    if rng.random() < 0.5:
        return TinyProblem(
            "percent",
            f"What is {percent}% of {whole}?",
            number_forms(part),
            f"{percent}% of {whole} is {whole} x {percent}/100 = {decimal_text(part)}.",
        )
    return TinyProblem(
        "percent",
        f"What percent of {whole} is {decimal_text(part)}?",
        (f"{percent}\\%", str(percent), f"{percent}.0\\%", f"{percent}\\text{{ percent}}"),
        f"{decimal_text(part)}/{whole} = {decimal_text(Fraction(percent, 100))}, which is "
        f"{percent} percent.",
    )


_NAMES = ("Ana", "Ben", "Carla", "Dan", "Eva", "Finn")
_THINGS = ("apples", "books", "coins", "stamps")


def _word_problem(rng: random.Random) -> TinyProblem:
    name, choice = rng.choice(_NAMES), rng.randrange(3)
    if choice == 0:
        thing = rng.choice(_THINGS)
        have, give, buy = rng.randint(5, 20), rng.randint(1, 5), rng.randint(1, 9)
        value = Fraction(have - give + buy)
        return TinyProblem(
            "word",
            f"{name} has {have} {thing}, gives away {give} and then gets {buy} more. "
            f"How many {thing} does {name} have now?",
            number_forms(value),
            f"{have} - {give} + {buy} = {value}.",
        )
    if choice == 1:
        length, pieces = rng.randint(1, 12), rng.choice((2, 3, 4, 5, 8))
        value = Fraction(length, pieces)
        return TinyProblem(
            "word",
            f"{name} cuts a {length} m rope into {pieces} equal pieces. "
            "How long is each piece in meters?",
            number_forms(value),
            f"{length} / {pieces} = {value}.",
        )
    slices, eaten = rng.choice((4, 6, 8, 10, 12)), rng.randint(1, 3)
    value = Fraction(eaten, slices)
    return TinyProblem(
        "word",
        f"A pizza has {slices} equal slices and {name} eats {eaten} of them. "
        "What fraction of the pizza does that make?",
        number_forms(value),
        f"{eaten} of {slices} slices is {eaten}/{slices} = {value}.",
    )


KINDS: tuple[Callable[[random.Random], TinyProblem], ...] = (
    _arithmetic,
    _fraction_sum,
    _decimal_sum,
    _unit_conversion,
    _percentage,
    _word_problem,
)


def generate_problems(n: int, seed: int) -> list[TinyProblem]:
    """``n`` distinct problems (distinct text) of random kinds, from ``seed`` alone; a kind whose
    problems run out (units and percentages have a few hundred) leaves the rest to the others."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[TinyProblem] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot make {n} distinct tiny problems; found only {len(out)}")
        problem = rng.choice(KINDS)(rng)
        if problem.problem not in seen:
            seen.add(problem.problem)
            out.append(problem)
    return out


def warmup_solution(
    problem: TinyProblem, rng: random.Random, canonical_share: float | None = None
) -> tuple[str, str]:
    """A worked solution ending in ``\\boxed{<a random correct form>}``, and that form. With
    ``canonical_share`` the box holds the canonical form (``forms[0]``) with that probability and
    one of the other forms otherwise (a single-form answer: always its form)."""
    if canonical_share is None:
        form = rng.choice(problem.forms)
    elif len(problem.forms) == 1 or rng.random() < canonical_share:
        form = problem.forms[0]
    else:
        form = rng.choice(problem.forms[1:])
    return f"{problem.steps} The answer is \\boxed{{{form}}}.", form


def build(
    out: str | Path, seed: int, n_train: int = 2000, n_dev: int = 200, n_test: int = 200
) -> Path:
    """Write the task's splits, warmup set and meta.json into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    problems = generate_problems(n_train + n_dev + n_test, seed)
    splits = {
        "train": problems[:n_train],
        "dev": problems[n_train : n_train + n_dev],
        "test": problems[n_train + n_dev :],
    }
    for name, items in splits.items():
        write_jsonl(
            out / f"{name}.jsonl",
            [
                {
                    "id": f"tiny-{name}-{i:05d}",
                    "kind": p.kind,
                    "problem": p.problem,
                    "answer": p.forms[0],
                    "answer_forms": list(p.forms),
                }
                for i, p in enumerate(items)
            ],
        )
    rng = random.Random(seed + 2)
    warm = []
    for i, p in enumerate(splits["train"]):
        solution, form = warmup_solution(p, rng)
        warm.append(
            {
                "id": f"tiny-train-{i:05d}",
                "problem": p.problem,
                "solution": solution,
                "answer": form,
            }
        )
    write_jsonl(out / "warmup.jsonl", warm)
    meta = {
        "seed": seed,
        "sizes": {name: len(items) for name, items in splits.items()},
        "kinds": dict(sorted(Counter(p.kind for p in problems).items())),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """``rows`` as JSON lines (UTF-8, ``\n`` endings, so builds are byte-identical everywhere)."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cer.tasks.arithmetic", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the tiny task's splits and warmup set")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--n-train", type=int, default=2000)
    b.add_argument("--n-dev", type=int, default=200)
    b.add_argument("--n-test", type=int, default=200)
    args = parser.parse_args(argv)
    out = build(args.out, args.seed, args.n_train, args.n_dev, args.n_test)
    print(f"wrote the tiny CER task to {out}")


if __name__ == "__main__":
    main()
