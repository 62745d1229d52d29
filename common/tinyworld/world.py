"""Seeded synthetic knowledge base: people, cities, countries, films and organisations.

Every name is invented from syllables, so no real-world knowledge helps, and the words of
each entity kind come from disjoint pools, so a name query (BM25) finds its own document
first. Each entity has one short document in Search-R1's corpus format.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"]
ONSETS += ["br", "dr", "kr", "tr", "st", "th", "sh", "ch", "h", "j"]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "u", "ai", "ei", "ou"]
CODAS = ["", "", "", "", "n", "r", "l", "s", "m", "k"]
COMPANY_SUFFIXES = ["Industries", "Group", "Works", "Labs", "Company", "Holdings"]
UNIVERSITY_SUFFIXES = ["University", "Institute", "College", "Academy"]
# Invented words must never coincide with the words the documents and questions are made of,
# nor with the English stopwords (bm25s) the syllables can spell, which a retriever drops.
RESERVED_WORDS = {
    "born", "city", "country", "film", "directed", "founded", "company", "university", "capital",
    "population", "released", "headquartered", "where", "which", "what", "year", "first", "same",
    "were", "whose", "with", "came", "out", "larger", "earlier", "later", "search", "answer",
    "think", "information", "question", "title", "doc",
    "before", "have", "haven", "here", "more", "some", "there", "these", "those",
}  # fmt: skip


@dataclass(frozen=True)
class WorldSizes:
    """How many entities of each kind the generator makes (defaults measured in DESIGN.md)."""

    people: int = 600
    cities: int = 100
    countries: int = 50
    films: int = 300
    organisations: int = 100

    def validate(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 2:
                raise ValueError(
                    f"WorldSizes.{field.name} must be at least 2, got {getattr(self, field.name)}"
                )
        if self.countries > self.cities:
            raise ValueError(
                f"WorldSizes: every country needs a capital city, so countries ({self.countries}) "
                f"must not exceed cities ({self.cities})"
            )


@dataclass(frozen=True)
class Person:
    id: str
    name: str
    birth_city: str
    birth_year: int


@dataclass(frozen=True)
class City:
    id: str
    name: str
    country: str
    population: int


@dataclass(frozen=True)
class Country:
    id: str
    name: str
    capital: str


@dataclass(frozen=True)
class Film:
    id: str
    title: str
    director: str
    year: int

    @property
    def name(self) -> str:
        return self.title


@dataclass(frozen=True)
class Organisation:
    id: str
    name: str
    kind: str  # "company" or "university"
    founder: str
    headquarters: str
    founded: int


Entity = Person | City | Country | Film | Organisation


@dataclass(frozen=True)
class Document:
    """One corpus entry; `contents` is Search-R1's `"Title"\\ntext`."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'


@dataclass(frozen=True)
class World:
    seed: int
    people: tuple[Person, ...]
    cities: tuple[City, ...]
    countries: tuple[Country, ...]
    films: tuple[Film, ...]
    organisations: tuple[Organisation, ...]

    @cached_property
    def entities(self) -> dict[str, Entity]:
        """Every entity by id."""
        everything = (*self.people, *self.cities, *self.countries, *self.films, *self.organisations)
        return {e.id: e for e in everything}

    def name(self, entity_id: str) -> str:
        return self.entities[entity_id].name

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "world.json") -> World:
        kinds = {
            "people": Person,
            "cities": City,
            "countries": Country,
            "films": Film,
            "organisations": Organisation,
        }
        try:
            parts = {key: tuple(kind(**row) for row in data[key]) for key, kind in kinds.items()}
            return cls(seed=int(data["seed"]), **parts)
        except (KeyError, TypeError) as err:
            raise ValueError(f"{source}: not a tiny-world knowledge base ({err})") from err


def load_world(path: str | Path) -> World:
    """Read a `world.json` written by `build_world`."""
    path = Path(path)
    return World.from_json(json.loads(path.read_text(encoding="utf-8")), source=str(path))


def _invent_words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    """`count` new capitalised words of 2-3 syllables, none in `taken` (which is updated)."""
    words: list[str] = []
    while len(words) < count:
        n_syllables = rng.choice((2, 2, 2, 3))
        word = "".join(
            rng.choice(ONSETS)
            + rng.choice(VOWELS)
            + (rng.choice(CODAS) if i == n_syllables - 1 else "")
            for i in range(n_syllables)
        ).capitalize()
        if word.lower() in taken or word.lower() in RESERVED_WORDS:
            continue
        taken.add(word.lower())
        words.append(word)
    return words


def _distinct_pairs(
    rng: random.Random, first: list[str], second: list[str], count: int
) -> list[str]:
    """`count` distinct two-word names, each word drawn from its own pool."""
    if count > len(first) * len(second):
        raise ValueError(
            f"cannot make {count} distinct names from {len(first)}x{len(second)} words"
        )
    picks = rng.sample(range(len(first) * len(second)), count)
    return [f"{first[i // len(second)]} {second[i % len(second)]}" for i in picks]


def _distinct_word_sets(rng: random.Random, words: list[str], count: int) -> list[str]:
    """`count` two-word names from one pool whose word sets differ, since a bag-of-words
    retriever cannot tell "A B" from "B A"."""
    if count > len(words) * (len(words) - 1) // 2:
        raise ValueError(f"cannot make {count} distinct names from {len(words)} words")
    seen: set[frozenset[str]] = set()
    names: list[str] = []
    while len(names) < count:
        pair = rng.sample(words, 2)
        if frozenset(pair) not in seen:
            seen.add(frozenset(pair))
            names.append(" ".join(pair))
    return names


def generate_world(seed: int = 0, sizes: WorldSizes = WorldSizes()) -> World:
    """The knowledge base for `seed`; the same seed and sizes always give the same world."""
    sizes.validate()
    rng = random.Random(seed)
    taken: set[str] = set()

    country_names = _invent_words(rng, sizes.countries, taken)
    city_names = _invent_words(rng, sizes.cities, taken)
    populations = rng.sample(
        range(8, 3000), sizes.cities
    )  # distinct, so comparisons have one answer
    # Each country's capital comes first among the cities, so every country has at least one city.
    city_country = list(range(sizes.countries)) + [
        rng.randrange(sizes.countries) for _ in range(sizes.cities - sizes.countries)
    ]
    cities = tuple(
        City(
            f"city-{i:04d}", city_names[i], f"country-{city_country[i]:04d}", populations[i] * 1000
        )
        for i in range(sizes.cities)
    )
    countries = tuple(
        Country(f"country-{i:04d}", country_names[i], f"city-{i:04d}")
        for i in range(sizes.countries)
    )

    given = _invent_words(rng, max(4, sizes.people // 5), taken)
    family = _invent_words(rng, max(4, sizes.people // 2), taken)
    people = tuple(
        Person(
            f"person-{i:04d}",
            name,
            cities[rng.randrange(sizes.cities)].id,
            rng.randint(1900, 1985),
        )
        for i, name in enumerate(_distinct_pairs(rng, given, family, sizes.people))
    )

    film_words = _invent_words(rng, max(4, (2 * sizes.films) // 3), taken)
    films = []
    for i, title in enumerate(_distinct_word_sets(rng, film_words, sizes.films)):
        director = people[rng.randrange(sizes.people)]
        year = rng.randint(director.birth_year + 25, min(director.birth_year + 65, 2023))
        films.append(Film(f"film-{i:04d}", title, director.id, year))

    org_words = _invent_words(rng, sizes.organisations, taken)
    organisations = []
    for i, word in enumerate(org_words):
        kind = rng.choice(("company", "company", "university"))
        suffix = rng.choice(COMPANY_SUFFIXES if kind == "company" else UNIVERSITY_SUFFIXES)
        founder = people[rng.randrange(sizes.people)]
        founded = rng.randint(founder.birth_year + 22, min(founder.birth_year + 60, 2023))
        hq = cities[rng.randrange(sizes.cities)].id
        organisations.append(
            Organisation(f"org-{i:04d}", f"{word} {suffix}", kind, founder.id, hq, founded)
        )

    return World(seed, people, cities, countries, tuple(films), tuple(organisations))


def permute_names(world: World, seed: int) -> World:
    """``world`` with every name moved to another entity of its kind (a permutation drawn from
    ``seed``; organisations within their kind, so a university keeps a university's suffix):
    the same names, ids, relations, years and populations, so every fact stated with names is
    new. A model trained on ``world`` reads and tokenizes the result as before but recalls
    wrong facts about it; only searching finds the right ones."""
    rng = random.Random(f"{seed}:names")

    def moved(entities: tuple, key=lambda e: "") -> tuple:
        names = {}
        for group in sorted({key(e) for e in entities}):
            members = [e for e in entities if key(e) == group]
            shuffled = [e.name for e in members]
            rng.shuffle(shuffled)
            names.update(zip((e.id for e in members), shuffled, strict=True))
        field = "title" if entities and isinstance(entities[0], Film) else "name"
        return tuple(dataclasses.replace(e, **{field: names[e.id]}) for e in entities)

    return dataclasses.replace(
        world,
        people=moved(world.people),
        cities=moved(world.cities),
        countries=moved(world.countries),
        films=moved(world.films),
        organisations=moved(world.organisations, key=lambda o: o.kind),
    )


def documents(world: World) -> list[Document]:
    """One short document per entity, in id order within each kind."""
    name = world.name
    docs = [
        Document(p.id, p.name, f"{p.name} was born in {name(p.birth_city)} in {p.birth_year}.")
        for p in world.people
    ]
    docs += [
        Document(
            c.id,
            c.name,
            f"{c.name} is a city in {name(c.country)} with a population of {c.population:,}.",
        )
        for c in world.cities
    ]
    docs += [
        Document(k.id, k.name, f"{k.name} is a country whose capital is {name(k.capital)}.")
        for k in world.countries
    ]
    docs += [
        Document(f.id, f.title, f"{f.title} is a {f.year} film directed by {name(f.director)}.")
        for f in world.films
    ]
    docs += [
        Document(
            o.id,
            o.name,
            f"{o.name} is a {o.kind} founded by {name(o.founder)} in {o.founded}. "
            f"It is headquartered in {name(o.headquarters)}.",
        )
        for o in world.organisations
    ]
    return docs
