"""The tiny alias task: short reading comprehension over a tiny world, answers with aliases.

Each problem is a context of 2-4 one-sentence documents from a seeded tiny world
(``common.tinyworld.world``) and a question whose answer is in the context. Kinds and the correct
surface forms of their answers (``answer_forms``; the first is the canonical ``answer``):

- ``director`` "Who directed Kel Dor?" and ``founder`` "Who founded Vam Works?": the full name
  ``Tusha Shusti`` or the surname ``Shusti``;
- ``count`` "How many films in the context did Tusha Shusti direct?": ``2`` or ``two``;
- ``population`` "What is the population of Lomira?": ``2,795,000`` or ``2795000``;
- ``birth_year`` and ``capital``: one form (``1954``; ``Lomira``).

The warmup solution of a train problem restates the fact it needs and ends in
``\\boxed{<a random correct form>}``, so exact match against the canonical answer rejects many
right answers; the rows carry ``verifier: "alias"``, which makes ``cer.rewards.verifiers.alias_verifier``
(any listed form, normalised) their rule verifier.

Where names and facts come from (``worlds``):

- ``shared-names`` (default): the names of one seeded world (``SHARED_WORLD_SIZES``, its documents
  written to ``documents.jsonl`` as the tokenizer's corpus), the facts of a fresh small world every
  ``PROBLEMS_PER_WORLD`` problems (``renamed``), so a name recurs but its facts must be read from
  the context; ``name_holdout`` (``_draw_names``, default ``asked``): dev and test ask about
  entities held out of train questions, 10% of each kind each (``holdout_pools``);
- ``shared``: every split from that one world's facts; dev and test ask about held-out entities
  and no train problem names one (measured: the model memorises the world, README);
- ``fresh`` (the first version): a fresh small world with its own names every
  ``PROBLEMS_PER_WORLD`` problems and separate worlds per split, so names seldom repeat and dev
  names are unseen in train (the tokenizer must split them into syllable pieces).

No split shares a problem text with another.

    python -m cer.tasks.alias build --out DIR --seed N [--worlds shared-names|shared|fresh]
        [--name-holdout asked|subjects|names|none] [--n-train 13000 --n-dev 200 --n-test 200]

writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (``id, kind, problem, answer,
answer_forms, verifier``), ``warmup.jsonl`` (``id, problem, solution, answer``),
``meta.json`` (and ``documents.jsonl``), as ``cer.tasks.arithmetic`` does. Same seed, sizes and options,
same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from cer.tasks.arithmetic import TinyProblem, warmup_solution, write_jsonl
from common.tinyworld.world import Film, World, WorldSizes, documents, generate_world

TASK = "alias"
VERIFIER = "alias"
SPLITS = ("train", "dev", "test")
# More films than people, so that many people direct 1-3 films (the count questions).
WORLD_SIZES = WorldSizes(people=60, cities=20, countries=10, films=90, organisations=30)
# Problems drawn from one world before the next: a fresh world every few problems keeps names
# from repeating, so the model must copy them from the context rather than recall them.
PROBLEMS_PER_WORLD = 25
# ``worlds``: "shared" draws every split from one larger world (its documents are the tokenizer's
# corpus, dev and test ask about held-out entities); "shared-names" takes that world's names
# (each split its own held-out share) but draws the facts afresh every PROBLEMS_PER_WORLD problems
# (a small world renamed), so that no fact can be recalled; "fresh" is a new small world every
# PROBLEMS_PER_WORLD problems with its own invented names, separate worlds per split (the first
# version).
WORLDS = ("shared-names", "shared", "fresh")
DEFAULT_WORLDS = "shared-names"
# The shared world: the tiny search world's people and films, more of the rarer kinds so that a
# 10% hold-out leaves each dev kind 10-60 subjects; as many films per person as WORLD_SIZES has
# would make every name a film director, so count questions use the 1-3-film directors.
SHARED_WORLD_SIZES = WorldSizes(people=600, cities=200, countries=100, films=400, organisations=200)
HOLDOUT = 0.1
ENTITY_KINDS = ("people", "cities", "countries", "films", "organisations")
# shared-names: which names a dev or test world holds out of train (``_draw_names``).
NAME_HOLDOUTS = ("asked", "subjects", "names", "none")
CANONICAL_SHARE_HELP = (
    "the share of warmup solutions that box the canonical form (default: a correct form at "
    "random); 0.9 makes the warmup a confident self-verifier (make compare-cer-selfverify)"
)
DEFAULT_NAME_HOLDOUT = "asked"
# Train problems when none are asked for: shared-names has as many as 800 warmup steps of 16
# see (about once each; 2,000 were memorised, README), the others the 2,000 they were measured on.
DEFAULT_N_TRAIN = {"shared-names": 13000, "shared": 2000, "fresh": 2000}
NAME_HOLDOUT_HELP = (
    "shared-names only (default asked): asked (dev/test subjects are never asked about in "
    "train, their names may stand in train contexts with other facts), subjects (no train "
    "problem names them at all), names (every name of a dev/test world held out), none"
)
# shared-names: the small worlds' sizes, at most the held-out share of SHARED_WORLD_SIZES per kind
# (every dev world uses every dev name of a kind, permuted).
RENAMED_WORLD_SIZES = WorldSizes(people=60, cities=20, countries=10, films=40, organisations=20)
WORLDS_HELP = (
    "shared-names: one seeded world's names (dev and test about held-out entities, see "
    "--name-holdout), facts drawn afresh every 25 problems, the world's documents the "
    "tokenizer's corpus; shared: that one "
    "world for every split, dev and test about held-out entities; fresh: a new small world every 25 problems, separate worlds "
    "per split"
)
DOCUMENTS_FILE = "documents.jsonl"
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


# A maker draws one problem of its kind: ``(world, rng, pool)`` -> the problem and the ids of
# every entity its text names (``Made``). ``pool`` is the subjects it may ask about (None: any of
# the world's, the fresh-world draw, whose random calls stay as they were measured).
Made = tuple[TinyProblem, frozenset[str]]


def _subject_and_other(items, pool, rng: random.Random, key: Callable):
    """The subject (from ``pool``, or any of ``items`` when None) and a distractor of ``items``
    whose ``key`` differs (the answer is not the distractor's too)."""
    if pool is None:
        return _two_with_different(items, rng, key)
    while True:
        a, b = rng.choice(pool), rng.choice(items)
        if key(a) != key(b):
            return a, b


def _director(world: World, rng: random.Random, pool=None) -> Made:
    film, other = _subject_and_other(world.films, pool, rng, lambda f: f.director)
    fact = film_sentence(world, film)
    problem = _problem(
        "director",
        _context([fact, film_sentence(world, other)], rng),
        f"Who directed {film.title}?",
        person_forms(world.name(film.director)),
        fact,
    )
    return problem, frozenset({film.id, other.id, film.director, other.director})


def _founder(world: World, rng: random.Random, pool=None) -> Made:
    org, other = _subject_and_other(world.organisations, pool, rng, lambda o: o.founder)

    def sentence(o) -> str:
        return f"{o.name} was founded by {world.name(o.founder)} in {o.founded}."

    problem = _problem(
        "founder",
        _context([sentence(org), sentence(other)], rng),
        f"Who founded {org.name}?",
        person_forms(world.name(org.founder)),
        sentence(org),
    )
    return problem, frozenset({org.id, other.id, org.founder, other.founder})


def _count(world: World, rng: random.Random, pool=None) -> Made:
    by_director: dict[str, list[Film]] = {}
    for f in world.films:
        by_director.setdefault(f.director, []).append(f)
    allowed = None if pool is None else {p.id for p in pool}
    candidates = sorted(
        d
        for d, fs in by_director.items()
        if len(fs) <= MAX_COUNT and (allowed is None or d in allowed)
    )
    if not candidates:
        return None  # no director with 1-3 films among the allowed subjects
    director = rng.choice(candidates)
    own = by_director[director]
    others = [f for f in world.films if f.director != director]
    distractors = rng.sample(others, rng.randint(1, MAX_COUNT + 1 - len(own)))
    name = world.name(director)
    titles = [f.title for f in own]
    listed = titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]
    n = len(own)
    problem = _problem(
        "count",
        _context([film_sentence(world, f) for f in own + distractors], rng),
        f"How many films in the context did {name} direct?",
        count_forms(n),
        f"{name} directed {listed}: {n} film{'s' if n > 1 else ''}.",
    )
    films = own + distractors
    return problem, frozenset([director, *(f.id for f in films), *(f.director for f in films)])


def _population(world: World, rng: random.Random, pool=None) -> Made:
    if pool is None:
        city, other = rng.sample(world.cities, 2)
    else:
        city, other = _subject_and_other(world.cities, pool, rng, lambda c: c.id)

    def sentence(c) -> str:
        return f"{c.name} has a population of {c.population:,}."

    problem = _problem(
        "population",
        _context([sentence(city), sentence(other)], rng),
        f"What is the population of {city.name}?",
        population_forms(city.population),
        sentence(city),
    )
    return problem, frozenset({city.id, other.id})


def _birth_year(world: World, rng: random.Random, pool=None) -> Made:
    person, other = _subject_and_other(world.people, pool, rng, lambda p: p.birth_year)

    def sentence(p) -> str:
        return f"{p.name} was born in {world.name(p.birth_city)} in {p.birth_year}."

    problem = _problem(
        "birth_year",
        _context([sentence(person), sentence(other)], rng),
        f"In which year was {person.name} born?",
        (str(person.birth_year),),
        sentence(person),
    )
    return problem, frozenset({person.id, other.id, person.birth_city, other.birth_city})


def _capital(world: World, rng: random.Random, pool=None) -> Made:
    if pool is None:
        country, other = rng.sample(world.countries, 2)
    else:
        country, other = _subject_and_other(world.countries, pool, rng, lambda k: k.id)

    def sentence(k) -> str:
        return f"The capital of {k.name} is {world.name(k.capital)}."

    problem = _problem(
        "capital",
        _context([sentence(country), sentence(other)], rng),
        f"What is the capital of {country.name}?",
        (world.name(country.capital),),
        sentence(country),
    )
    return problem, frozenset({country.id, other.id, country.capital, other.capital})


def _two_with_different(items, rng: random.Random, key: Callable):
    """Two items of ``items`` whose ``key`` differs (the answer is not the distractor's too)."""
    while True:
        a, b = rng.sample(items, 2)
        if key(a) != key(b):
            return a, b


# (kind, weight): the person and number kinds have aliases; birth_year and capital do not.
KINDS: tuple[tuple[Callable[..., Made], int], ...] = (
    (_director, 2),
    (_founder, 2),
    (_count, 2),
    (_population, 2),
    (_birth_year, 1),
    (_capital, 1),
)
# The world's entities each kind asks about (its subject), for the shared world's hold-out.
SUBJECT_OF = {
    "director": "films",
    "founder": "organisations",
    "count": "people",
    "population": "cities",
    "birth_year": "people",
    "capital": "countries",
}


def generate_problems(
    world: World,
    n: int,
    rng: random.Random,
    seen: set[str],
    pools: dict[str, list] | None = None,
    banned: frozenset[str] = frozenset(),
) -> list[TinyProblem]:
    """``n`` problems over ``world`` whose texts are not in ``seen`` (which is updated). With
    ``pools`` (entity kind -> the subjects allowed) each problem asks about one of them, and a
    problem that names an entity of ``banned`` (ids) is drawn again."""
    makers, weights = zip(*KINDS, strict=True)
    out: list[TinyProblem] = []
    attempts = 0
    while len(out) < n:
        maker = rng.choices(makers, weights)[0]
        # The fresh draw takes the next kind after a repeat; with pools the kind is drawn again
        # until it fits, so that the hold-out does not tilt the mix of kinds.
        for _ in range(1 if pools is None else 1000):
            attempts += 1
            if attempts > 50 * n + 1000:
                raise ValueError(f"cannot make {n} distinct alias problems; found only {len(out)}")
            if pools is None:
                problem, names = maker(world, rng)
            else:
                made = maker(world, rng, pools[SUBJECT_OF[maker.__name__[1:]]])
                if made is None:
                    break  # this kind has no subject here: draw another kind
                problem, names = made
            if problem.problem not in seen and not names & banned:
                seen.add(problem.problem)
                out.append(problem)
                break
    return out


def world_seed(seed: int, split: int, k: int) -> int:
    """The seed of split ``split``'s ``k``-th world: distinct for every (seed, split, k < 10**6)."""
    return (3 * seed + split) * 10**6 + k


def fresh_split_problems(seed: int, sizes: dict[str, int]) -> dict[str, list[TinyProblem]]:
    """Each split's problems, ``PROBLEMS_PER_WORLD`` from each of its own worlds (``world_seed``),
    drawn with ``random.Random(seed)``; no problem text repeats across splits."""
    return _problems_per_world(
        seed, sizes, lambda i, name, k: (generate_world(world_seed(seed, i, k), WORLD_SIZES), None)
    )


def _problems_per_world(
    seed: int,
    sizes: dict[str, int],
    world_for: Callable[[int, str, int], tuple[World, dict[str, list] | None]],
) -> dict[str, list[TinyProblem]]:
    """Each split's problems, ``PROBLEMS_PER_WORLD`` from each world ``world_for(split index,
    split, k)`` gives (with the subjects allowed, or None for any), drawn with
    ``random.Random(seed)``; no problem text repeats across splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[TinyProblem]] = {}
    for i, name in enumerate(SPLITS):
        out[name] = []
        for k in range(-(-sizes[name] // PROBLEMS_PER_WORLD)):
            world, allowed = world_for(i, name, k)
            n = min(PROBLEMS_PER_WORLD, sizes[name] - len(out[name]))
            out[name] += generate_problems(world, n, rng, seen, allowed)
    return out


def shared_world(seed: int) -> World:
    """The one world of the ``shared`` build for ``seed``."""
    return generate_world(seed, SHARED_WORLD_SIZES)


def holdout_pools(world: World, seed: int, holdout: float = HOLDOUT) -> dict[str, dict[str, list]]:
    """Split -> entity kind -> its entities: per kind a shuffled ``holdout`` share for dev, as
    many for test, the rest for train (disjoint; as ``common.tinyworld.questions`` does)."""
    rng = random.Random(f"{seed}:alias-holdout")
    pools: dict[str, dict[str, list]] = {split: {} for split in SPLITS}
    for kind in sorted(set(SUBJECT_OF.values())):
        entities = list(getattr(world, kind))
        rng.shuffle(entities)
        n_held = max(1, round(holdout * len(entities)))
        pools["dev"][kind] = entities[:n_held]
        pools["test"][kind] = entities[n_held : 2 * n_held]
        pools["train"][kind] = entities[2 * n_held :]
    return pools


def held_out_ids(pools: dict[str, dict[str, list]], split: str) -> frozenset[str]:
    """The ids of every entity ``split`` holds out (all its kinds)."""
    return frozenset(e.id for entities in pools[split].values() for e in entities)


def shared_split_problems(seed: int, sizes: dict[str, int]) -> dict[str, list[TinyProblem]]:
    """Every split's problems from the one ``shared_world(seed)``, drawn with
    ``random.Random(seed)``. Dev (test) problems ask about dev (test) held-out entities
    (``holdout_pools``); a train problem names no held-out entity anywhere in its text (subject,
    distractor, director, founder, birth city or capital), a dev problem none of test's and a
    test problem none of dev's. No problem text repeats across splits."""
    world = shared_world(seed)
    pools = holdout_pools(world, seed)
    dev, test = held_out_ids(pools, "dev"), held_out_ids(pools, "test")
    banned = {"train": dev | test, "dev": test, "test": dev}
    rng = random.Random(seed)
    seen: set[str] = set()
    return {
        name: generate_problems(world, sizes[name], rng, seen, pools[name], banned[name])
        for name in SPLITS
    }


def renamed(world: World, names: dict[str, list[str]]) -> World:
    """``world`` with its entities of each kind renamed, in id order, by ``names[kind]``."""
    parts = {}
    for kind in ENTITY_KINDS:
        key = "title" if kind == "films" else "name"
        parts[kind] = tuple(
            dataclasses.replace(e, **{key: n})
            for e, n in zip(getattr(world, kind), names[kind], strict=True)
        )
    return World(world.seed, **parts)


def _draw_names(
    world: World, split: str, pools: dict[str, dict[str, list]], hold_out: str, rng
) -> tuple[dict[str, list[str]], dict[str, set[str]] | None]:
    """A small world's names for ``split`` and the names its problems may ask about (None: any).

    ``hold_out``: ``subjects`` (a train world takes train names; a dev or test world half of
    each kind from its own held-out names, shuffled in among train names, and asks about those
    only), ``asked`` (the same, but a train world takes any name and asks about train names
    only), ``names`` (every name from the split's own share) or ``none`` (any name, any split)."""
    if hold_out not in NAME_HOLDOUTS:
        raise ValueError(f"unknown name hold-out {hold_out!r}; known: {', '.join(NAME_HOLDOUTS)}")
    drawn: dict[str, list[str]] = {}
    subjects: dict[str, set[str]] = {}
    for kind in ENTITY_KINDS:
        n = len(getattr(world, kind))
        own = [e.name for e in pools[split][kind]]
        if hold_out == "none":
            drawn[kind] = rng.sample([e.name for p in pools.values() for e in p[kind]], n)
        elif hold_out == "asked" and split == "train":
            drawn[kind] = rng.sample([e.name for p in pools.values() for e in p[kind]], n)
            subjects[kind] = set(drawn[kind]) & set(own)
        elif hold_out == "names" or split == "train":
            drawn[kind] = rng.sample(own, n)
        else:
            mine = rng.sample(own, min(n // 2, len(own)))
            train = [e.name for e in pools["train"][kind]]
            drawn[kind] = mine + rng.sample(train, n - len(mine))
            rng.shuffle(drawn[kind])
            subjects[kind] = set(mine)
    return drawn, (subjects or None)


def shared_names_split_problems(
    seed: int, sizes: dict[str, int], hold_out: str = DEFAULT_NAME_HOLDOUT
) -> dict[str, list[TinyProblem]]:
    """Each split's problems, ``PROBLEMS_PER_WORLD`` from each of its own small worlds (the fresh
    build's relations, ``RENAMED_WORLD_SIZES``) renamed with names of ``shared_world(seed)``'s
    entities (``_draw_names``; by default no dev or test subject's name is in any train problem,
    and dev and test ask only about their own held-out names, as ``common.tinyworld`` holds out
    subjects). The facts change every ``PROBLEMS_PER_WORLD`` problems, so a name's tokens recur
    but its facts must be read from the context. No problem text repeats across splits."""
    world0 = shared_world(seed)
    pools = holdout_pools(world0, seed)
    if hold_out == "none":  # the first measured variant: any name of the world in any split
        pools = {
            "train": {k: list(getattr(world0, k)) for k in ENTITY_KINDS},
            "dev": {k: [] for k in ENTITY_KINDS},
            "test": {k: [] for k in ENTITY_KINDS},
        }

    def world_for(i: int, name: str, k: int) -> tuple[World, dict[str, list] | None]:
        wseed = world_seed(seed, i, k)
        small = generate_world(wseed, RENAMED_WORLD_SIZES)
        names, subjects = _draw_names(small, name, pools, hold_out, random.Random(wseed))
        world = renamed(small, names)
        if subjects is None:
            return world, None
        allowed = {
            kind: [e for e in getattr(world, kind) if e.name in subjects[kind]]
            for kind in ENTITY_KINDS
        }
        return world, allowed

    return _problems_per_world(seed, sizes, world_for)


def split_problems(
    seed: int,
    sizes: dict[str, int],
    worlds: str = "fresh",
    name_holdout: str = DEFAULT_NAME_HOLDOUT,
) -> dict[str, list[TinyProblem]]:
    """Each split's problems: ``worlds="fresh"`` (``fresh_split_problems``), ``"shared"``
    (``shared_split_problems``) or ``"shared-names"`` (``shared_names_split_problems``)."""
    if worlds not in WORLDS:
        raise ValueError(f"unknown worlds {worlds!r}; known: {', '.join(WORLDS)}")
    if worlds == "shared":
        return shared_split_problems(seed, sizes)
    if worlds == "shared-names":
        return shared_names_split_problems(seed, sizes, name_holdout)
    return fresh_split_problems(seed, sizes)


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
    out: str | Path,
    seed: int,
    n_train: int | None = None,
    n_dev: int = 200,
    n_test: int = 200,
    worlds: str = DEFAULT_WORLDS,
    name_holdout: str = DEFAULT_NAME_HOLDOUT,
    canonical_share: float | None = None,
) -> Path:
    """Write the task's splits, warmup set and meta.json into ``out``; with
    ``worlds="shared"`` or ``"shared-names"`` also ``documents.jsonl``, the shared world's
    documents (the tokenizer's corpus, ``cer.tasks.build.tokenizer_texts``). ``name_holdout``: the
    shared-names build's hold-out (``_draw_names``); ``n_train`` defaults to
    ``DEFAULT_N_TRAIN[worlds]``; ``canonical_share``: the warmup boxes the canonical form
    with this probability (``arithmetic.warmup_solution``; default: a form at random)."""
    if worlds not in WORLDS:
        raise ValueError(f"unknown worlds {worlds!r}; known: {', '.join(WORLDS)}")
    if canonical_share is not None and not 0.0 <= canonical_share <= 1.0:
        raise ValueError(f"canonical_share must be in [0, 1], got {canonical_share}")
    n_train = DEFAULT_N_TRAIN[worlds] if n_train is None else n_train
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = {"train": n_train, "dev": n_dev, "test": n_test}
    splits = split_problems(seed, sizes, worlds, name_holdout)
    if worlds in ("shared", "shared-names"):
        docs = [{"id": d.id, "text": d.text} for d in documents(shared_world(seed))]
        write_jsonl(out / DOCUMENTS_FILE, docs)
    elif (out / DOCUMENTS_FILE).exists():
        (out / DOCUMENTS_FILE).unlink()  # a shared build's corpus would train the tokenizer
    for name, items in splits.items():
        write_jsonl(out / f"{name}.jsonl", [task_row(name, i, p) for i, p in enumerate(items)])
    rng = random.Random(seed + 2)
    warm = []
    for i, p in enumerate(splits["train"]):
        solution, form = warmup_solution(p, rng, canonical_share)
        warm.append(
            {
                "id": f"alias-train-{i:05d}",
                "problem": p.problem,
                "solution": solution,
                "answer": form,
            }
        )
    write_jsonl(out / "warmup.jsonl", warm)
    problems = [p for items in splits.values() for p in items]
    meta = {"task": TASK, "seed": seed}
    if worlds in ("shared", "shared-names"):
        meta |= {
            "worlds": worlds,
            "world_sizes": dataclasses.asdict(SHARED_WORLD_SIZES),
            "holdout": HOLDOUT,
        }
        if worlds == "shared-names":
            meta |= {
                "problems_per_world": PROBLEMS_PER_WORLD,
                "renamed_world_sizes": dataclasses.asdict(RENAMED_WORLD_SIZES),
                "name_holdout": name_holdout,
            }
    else:  # the fresh build's meta.json as it was before the option
        meta["problems_per_world"] = PROBLEMS_PER_WORLD
    if canonical_share is not None:
        meta["canonical_share"] = canonical_share
    meta |= {
        "sizes": {name: len(items) for name, items in splits.items()},
        "kinds": dict(sorted(Counter(p.kind for p in problems).items())),
        "with_aliases": sum(len(p.forms) > 1 for p in problems) / max(len(problems), 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cer.tasks.alias", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the alias task's splits and warmup set")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--n-train", type=int, default=None, help="default 13000 shared-names, 2000 otherwise"
    )
    b.add_argument("--n-dev", type=int, default=200)
    b.add_argument("--n-test", type=int, default=200)
    b.add_argument("--worlds", choices=WORLDS, default=DEFAULT_WORLDS, help=WORLDS_HELP)
    b.add_argument(
        "--name-holdout",
        choices=NAME_HOLDOUTS,
        default=DEFAULT_NAME_HOLDOUT,
        help=NAME_HOLDOUT_HELP,
    )
    b.add_argument("--canonical-share", type=float, default=None, help=CANONICAL_SHARE_HELP)
    args = parser.parse_args(argv)
    out = build(
        args.out,
        args.seed,
        args.n_train,
        args.n_dev,
        args.n_test,
        args.worlds,
        args.name_holdout,
        args.canonical_share,
    )
    print(f"wrote the tiny CER alias task to {out}")


if __name__ == "__main__":
    main()
