"""The tiny alias task: short reading comprehension over a tiny world, answers with aliases.

Each problem is a context of 2-4 one-sentence documents from a seeded tiny world
(``common.tinyworld.world``) and a question whose answer is in the context. Kinds and the correct
surface forms of their answers (``answer_forms``; the first is the canonical ``answer``):

- ``director`` "Who directed Kel Dor?" and ``founder`` "Who founded Vam Works?": the full name
  ``Tusha Shusti`` or the surname ``Shusti``;
- ``count`` "How many films in the context did Tusha Shusti direct?": ``2`` or ``two``;
- ``population`` "What is the population of Lomira?": ``2,795,000`` or ``2795000``;
- ``birth_year`` and ``capital``: one form (``1954``; ``Lomira``).

The warm-start solution of a train problem restates the fact it needs and ends in
``\\boxed{<a random correct form>}``, so exact match against the canonical answer rejects many
right answers; the rows carry ``verifier: "alias"``, which makes ``cer.verifiers.alias_verifier``
(any listed form, normalised) their rule verifier. Every ``PROBLEMS_PER_WORLD`` problems come
from a fresh small world and each split has its own worlds (``world_seed``), so names seldom
repeat (the model has to copy them from the context), dev and test names are unseen in train (the
tokenizer must split them into syllable pieces) and no split shares a problem text with another.

    python -m cer.aliastask build --out DIR --seed N [--n-train 2000 --n-dev 200 --n-test 200]

writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (``id, kind, problem, answer,
answer_forms, verifier``), ``warmstart.jsonl`` (``id, problem, solution, answer``) and
``meta.json``, as ``cer.tinytask`` does. Same seed and sizes, same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from cer.tinytask import TinyProblem, warm_start_solution, write_jsonl
from common.tinyworld.world import Film, World, WorldSizes, generate_world

TASK = "alias"
VERIFIER = "alias"
SPLITS = ("train", "dev", "test")
# More films than people, so that many people direct 1-3 films (the count questions).
WORLD_SIZES = WorldSizes(people=60, cities=20, countries=10, films=90, organisations=30)
# Problems drawn from one world before the next: a fresh world every few problems keeps names
# from repeating, so the model must copy them from the context rather than recall them.
PROBLEMS_PER_WORLD = 25
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
MAX_COUNT = 3


def person_forms(name: str) -> tuple[str, ...]:
    """A person's correct forms: the full name, then the surname (its last word)."""
    return (name, name.split()[-1])


def count_forms(n: int) -> tuple[str, ...]:
    """A small count as digits, then as a word (``3``, ``three``)."""
    return (str(n), NUMBER_WORDS[n]) if 0 <= n < len(NUMBER_WORDS) else (str(n),)


def population_forms(population: int) -> tuple[str, ...]:
    """A population as written in the world's documents (``2,795,000``), then as plain digits."""
    return (f"{population:,}", str(population))


def film_sentence(world: World, film: Film) -> str:
    return f"{film.title} is a {film.year} film directed by {world.name(film.director)}."


def _context(sentences: list[str], rng: random.Random) -> str:
    rng.shuffle(sentences)
    return "Context: " + " ".join(sentences)


def _problem(
    kind: str, context: str, question: str, forms: tuple[str, ...], steps: str
) -> TinyProblem:
    return TinyProblem(kind, f"{context}\nQuestion: {question}", forms, steps)


def _director(world: World, rng: random.Random) -> TinyProblem:
    film, other = _two_with_different(world.films, rng, lambda f: f.director)
    fact = film_sentence(world, film)
    return _problem(
        "director",
        _context([fact, film_sentence(world, other)], rng),
        f"Who directed {film.title}?",
        person_forms(world.name(film.director)),
        fact,
    )


def _founder(world: World, rng: random.Random) -> TinyProblem:
    org, other = _two_with_different(world.organisations, rng, lambda o: o.founder)

    def sentence(o) -> str:
        return f"{o.name} was founded by {world.name(o.founder)} in {o.founded}."

    return _problem(
        "founder",
        _context([sentence(org), sentence(other)], rng),
        f"Who founded {org.name}?",
        person_forms(world.name(org.founder)),
        sentence(org),
    )


def _count(world: World, rng: random.Random) -> TinyProblem:
    by_director: dict[str, list[Film]] = {}
    for f in world.films:
        by_director.setdefault(f.director, []).append(f)
    candidates = sorted(d for d, fs in by_director.items() if len(fs) <= MAX_COUNT)
    director = rng.choice(candidates)
    own = by_director[director]
    others = [f for f in world.films if f.director != director]
    distractors = rng.sample(others, rng.randint(1, MAX_COUNT + 1 - len(own)))
    name = world.name(director)
    titles = [f.title for f in own]
    listed = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
    n = len(own)
    return _problem(
        "count",
        _context([film_sentence(world, f) for f in own + distractors], rng),
        f"How many films in the context did {name} direct?",
        count_forms(n),
        f"{name} directed {listed}: {n} film{'s' if n > 1 else ''}.",
    )


def _population(world: World, rng: random.Random) -> TinyProblem:
    city, other = rng.sample(world.cities, 2)

    def sentence(c) -> str:
        return f"{c.name} has a population of {c.population:,}."

    return _problem(
        "population",
        _context([sentence(city), sentence(other)], rng),
        f"What is the population of {city.name}?",
        population_forms(city.population),
        sentence(city),
    )


def _birth_year(world: World, rng: random.Random) -> TinyProblem:
    person, other = _two_with_different(world.people, rng, lambda p: p.birth_year)

    def sentence(p) -> str:
        return f"{p.name} was born in {world.name(p.birth_city)} in {p.birth_year}."

    return _problem(
        "birth_year",
        _context([sentence(person), sentence(other)], rng),
        f"In which year was {person.name} born?",
        (str(person.birth_year),),
        sentence(person),
    )


def _capital(world: World, rng: random.Random) -> TinyProblem:
    country, other = rng.sample(world.countries, 2)

    def sentence(k) -> str:
        return f"The capital of {k.name} is {world.name(k.capital)}."

    return _problem(
        "capital",
        _context([sentence(country), sentence(other)], rng),
        f"What is the capital of {country.name}?",
        (world.name(country.capital),),
        sentence(country),
    )


def _two_with_different(items, rng: random.Random, key: Callable):
    """Two items of ``items`` whose ``key`` differs (the answer is not the distractor's too)."""
    while True:
        a, b = rng.sample(items, 2)
        if key(a) != key(b):
            return a, b


# (kind, weight): the person and number kinds have aliases; birth_year and capital do not.
KINDS: tuple[tuple[Callable[[World, random.Random], TinyProblem], int], ...] = (
    (_director, 2),
    (_founder, 2),
    (_count, 2),
    (_population, 2),
    (_birth_year, 1),
    (_capital, 1),
)


def generate_problems(
    world: World, n: int, rng: random.Random, seen: set[str]
) -> list[TinyProblem]:
    """``n`` problems over ``world`` whose texts are not in ``seen`` (which is updated)."""
    makers, weights = zip(*KINDS, strict=True)
    out: list[TinyProblem] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot make {n} distinct alias problems; found only {len(out)}")
        problem = rng.choices(makers, weights)[0](world, rng)
        if problem.problem not in seen:
            seen.add(problem.problem)
            out.append(problem)
    return out


def world_seed(seed: int, split: int, k: int) -> int:
    """The seed of split ``split``'s ``k``-th world: distinct for every (seed, split, k < 10**6)."""
    return (3 * seed + split) * 10**6 + k


def split_problems(seed: int, sizes: dict[str, int]) -> dict[str, list[TinyProblem]]:
    """Each split's problems, ``PROBLEMS_PER_WORLD`` from each of its own worlds (``world_seed``),
    drawn with ``random.Random(seed)``; no problem text repeats across splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[TinyProblem]] = {}
    for i, name in enumerate(SPLITS):
        out[name] = []
        for k in range(-(-sizes[name] // PROBLEMS_PER_WORLD)):
            world = generate_world(world_seed(seed, i, k), WORLD_SIZES)
            n = min(PROBLEMS_PER_WORLD, sizes[name] - len(out[name]))
            out[name] += generate_problems(world, n, rng, seen)
    return out


def task_row(split: str, i: int, p: TinyProblem) -> dict:
    """One split row: the loader's ``answer`` format plus the forms and the verifier name."""
    return {
        "id": f"alias-{split}-{i:05d}",
        "kind": p.kind,
        "problem": p.problem,
        "answer": p.forms[0],
        "answer_forms": list(p.forms),
        "verifier": VERIFIER,
    }


def build(
    out: str | Path, seed: int, n_train: int = 2000, n_dev: int = 200, n_test: int = 200
) -> Path:
    """Write the task's splits, warm-start set and meta.json into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits = split_problems(seed, {"train": n_train, "dev": n_dev, "test": n_test})
    for name, items in splits.items():
        write_jsonl(out / f"{name}.jsonl", [task_row(name, i, p) for i, p in enumerate(items)])
    rng = random.Random(seed + 2)
    warm = []
    for i, p in enumerate(splits["train"]):
        solution, form = warm_start_solution(p, rng)
        warm.append(
            {
                "id": f"alias-train-{i:05d}",
                "problem": p.problem,
                "solution": solution,
                "answer": form,
            }
        )
    write_jsonl(out / "warmstart.jsonl", warm)
    problems = [p for items in splits.values() for p in items]
    meta = {
        "task": TASK,
        "seed": seed,
        "problems_per_world": PROBLEMS_PER_WORLD,
        "sizes": {name: len(items) for name, items in splits.items()},
        "kinds": dict(sorted(Counter(p.kind for p in problems).items())),
        "with_aliases": sum(len(p.forms) > 1 for p in problems) / max(len(problems), 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cer.aliastask", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the alias task's splits and warm-start set")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--n-train", type=int, default=2000)
    b.add_argument("--n-dev", type=int, default=200)
    b.add_argument("--n-test", type=int, default=200)
    args = parser.parse_args(argv)
    out = build(args.out, args.seed, args.n_train, args.n_dev, args.n_test)
    print(f"wrote the tiny CER alias task to {out}")


if __name__ == "__main__":
    main()
