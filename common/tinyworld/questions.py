"""Questions over a tiny world, with gold answers, gold search paths and supporting documents.

Kinds: single-hop lookups, 2- and 3-hop bridges, comparisons and yes/no questions. For
every question `gold_queries[i]` is the query an ideal agent issues at step i and
`supporting_ids[i]` the document that query must find. Subjects (the entities a question
starts from) are split by entity, so dev and test subjects never start a train question.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from common.tinyworld.world import City, Country, Entity, Film, Organisation, Person, World

SPLITS = ("train", "dev", "test")
KINDS = ("people", "cities", "countries", "films", "organisations")


@dataclass(frozen=True)
class SplitSizes:
    """Questions per split, and the fraction of each entity kind held out as dev (and as test) subjects."""

    train: int = 4000
    dev: int = 500
    test: int = 500
    holdout: float = 0.1

    def validate(self) -> None:
        for split in SPLITS:
            if getattr(self, split) < 1:
                raise ValueError(
                    f"SplitSizes.{split} must be at least 1, got {getattr(self, split)}"
                )
        if not 0 < self.holdout < 0.5:
            raise ValueError(f"SplitSizes.holdout must lie in (0, 0.5), got {self.holdout}")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    golden_answers: tuple[str, ...]
    type: str  # single_hop | bridge | comparison | yes_no
    relation: str  # the template, e.g. "director_birthplace"
    hops: int
    gold_queries: tuple[str, ...]
    supporting_ids: tuple[str, ...]
    answer_type: str  # person | city | country | film | organisation | year | number | yes_no
    subjects: tuple[str, ...]

    def to_flashrag(self) -> dict[str, Any]:
        """The FlashRAG jsonl row: `{id, question, golden_answers, metadata}`."""
        metadata = {
            "type": self.type,
            "relation": self.relation,
            "hops": self.hops,
            "gold_queries": list(self.gold_queries),
            "supporting_ids": list(self.supporting_ids),
            "answer_type": self.answer_type,
            "subjects": list(self.subjects),
        }
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "metadata": metadata,
        }


Pool = dict[str, list[Entity]]  # entity kind -> entities allowed as subjects
Make = Callable[[World, random.Random, Pool], Question | None]


def _q(
    text: str,
    answers: Sequence[str],
    qtype: str,
    answer_type: str,
    path: Sequence[Entity],
    subjects: Sequence[Entity],
) -> Question:
    """A question whose gold search path visits `path` in order, one name query per entity."""
    return Question(
        id="",
        question=text,
        golden_answers=tuple(answers),
        type=qtype,
        relation="",
        hops=len(path),
        gold_queries=tuple(e.name for e in path),
        supporting_ids=tuple(e.id for e in path),
        answer_type=answer_type,
        subjects=tuple(e.id for e in subjects),
    )


def _number(n: int) -> tuple[str, ...]:
    return (f"{n:,}", str(n))


def _birthplace(w: World, r: random.Random, pool: Pool) -> Question:
    p: Person = r.choice(pool["people"])
    return _q(f"Where was {p.name} born?", [w.name(p.birth_city)], "single_hop", "city", [p], [p])


def _birth_year(w: World, r: random.Random, pool: Pool) -> Question:
    p: Person = r.choice(pool["people"])
    return _q(
        f"In which year was {p.name} born?", [str(p.birth_year)], "single_hop", "year", [p], [p]
    )


def _director(w: World, r: random.Random, pool: Pool) -> Question:
    f: Film = r.choice(pool["films"])
    return _q(f"Who directed {f.title}?", [w.name(f.director)], "single_hop", "person", [f], [f])


def _release_year(w: World, r: random.Random, pool: Pool) -> Question:
    f: Film = r.choice(pool["films"])
    return _q(
        f"In which year was {f.title} released?", [str(f.year)], "single_hop", "year", [f], [f]
    )


def _city_country(w: World, r: random.Random, pool: Pool) -> Question:
    c: City = r.choice(pool["cities"])
    return _q(
        f"In which country is {c.name}?", [w.name(c.country)], "single_hop", "country", [c], [c]
    )


def _population(w: World, r: random.Random, pool: Pool) -> Question:
    c: City = r.choice(pool["cities"])
    text = f"What is the population of {c.name}?"
    return _q(text, _number(c.population), "single_hop", "number", [c], [c])


def _capital(w: World, r: random.Random, pool: Pool) -> Question:
    k: Country = r.choice(pool["countries"])
    return _q(
        f"What is the capital of {k.name}?", [w.name(k.capital)], "single_hop", "city", [k], [k]
    )


def _founder(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    return _q(f"Who founded {o.name}?", [w.name(o.founder)], "single_hop", "person", [o], [o])


def _headquarters(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    text = f"In which city is {o.name} headquartered?"
    return _q(text, [w.name(o.headquarters)], "single_hop", "city", [o], [o])


def _founding_year(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    text = f"In which year was {o.name} founded?"
    return _q(text, [str(o.founded)], "single_hop", "year", [o], [o])


def _director_birthplace(w: World, r: random.Random, pool: Pool) -> Question:
    f: Film = r.choice(pool["films"])
    d: Person = w.entities[f.director]
    text = f"Where was the director of {f.title} born?"
    return _q(text, [w.name(d.birth_city)], "bridge", "city", [f, d], [f])


def _director_birth_year(w: World, r: random.Random, pool: Pool) -> Question:
    f: Film = r.choice(pool["films"])
    d: Person = w.entities[f.director]
    text = f"In which year was the director of {f.title} born?"
    return _q(text, [str(d.birth_year)], "bridge", "year", [f, d], [f])


def _birth_country(w: World, r: random.Random, pool: Pool) -> Question:
    p: Person = r.choice(pool["people"])
    c: City = w.entities[p.birth_city]
    text = f"In which country was {p.name} born?"
    return _q(text, [w.name(c.country)], "bridge", "country", [p, c], [p])


def _founder_birthplace(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    f: Person = w.entities[o.founder]
    text = f"Where was the founder of {o.name} born?"
    return _q(text, [w.name(f.birth_city)], "bridge", "city", [o, f], [o])


def _headquarters_country(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    c: City = w.entities[o.headquarters]
    text = f"In which country is {o.name} headquartered?"
    return _q(text, [w.name(c.country)], "bridge", "country", [o, c], [o])


def _capital_population(w: World, r: random.Random, pool: Pool) -> Question:
    k: Country = r.choice(pool["countries"])
    c: City = w.entities[k.capital]
    text = f"What is the population of the capital of {k.name}?"
    return _q(text, _number(c.population), "bridge", "number", [k, c], [k])


def _director_birth_country(w: World, r: random.Random, pool: Pool) -> Question:
    f: Film = r.choice(pool["films"])
    d: Person = w.entities[f.director]
    c: City = w.entities[d.birth_city]
    text = f"In which country was the director of {f.title} born?"
    return _q(text, [w.name(c.country)], "bridge", "country", [f, d, c], [f])


def _founder_birth_country(w: World, r: random.Random, pool: Pool) -> Question:
    o: Organisation = r.choice(pool["organisations"])
    f: Person = w.entities[o.founder]
    c: City = w.entities[f.birth_city]
    text = f"In which country was the founder of {o.name} born?"
    return _q(text, [w.name(c.country)], "bridge", "country", [o, f, c], [o])


def _birth_country_capital(w: World, r: random.Random, pool: Pool) -> Question:
    p: Person = r.choice(pool["people"])
    c: City = w.entities[p.birth_city]
    k: Country = w.entities[c.country]
    text = f"What is the capital of the country where {p.name} was born?"
    return _q(text, [w.name(k.capital)], "bridge", "city", [p, c, k], [p])


def _comparison(kind: str, key: str, text: str, answer_type: str, smaller_wins: bool) -> Make:
    """Two subjects of `kind` compared on attribute `key`; ties are skipped."""

    def make(w: World, r: random.Random, pool: Pool) -> Question | None:
        if len(pool[kind]) < 2:
            return None
        a, b = r.sample(pool[kind], 2)
        if getattr(a, key) == getattr(b, key):
            return None
        wins = (getattr(a, key) < getattr(b, key)) == smaller_wins
        winner = a if wins else b
        return _q(
            text.format(a=a.name, b=b.name),
            [winner.name],
            "comparison",
            answer_type,
            [a, b],
            [a, b],
        )

    return make


def _same_birthplace(yes: bool) -> Make:
    def make(w: World, r: random.Random, pool: Pool) -> Question | None:
        a: Person = r.choice(pool["people"])
        others = [p for p in pool["people"] if p is not a and (p.birth_city == a.birth_city) == yes]
        if not others:
            return None
        b: Person = r.choice(others)
        text = f"Were {a.name} and {b.name} born in the same city?"
        return _q(text, ["yes" if yes else "no"], "yes_no", "yes_no", [a, b], [a, b])

    return make


def _city_in_country(yes: bool) -> Make:
    def make(w: World, r: random.Random, pool: Pool) -> Question:
        c: City = r.choice(pool["cities"])
        country = c.country if yes else r.choice([k.id for k in w.countries if k.id != c.country])
        text = f"Is {c.name} in {w.name(country)}?"
        return _q(text, ["yes" if yes else "no"], "yes_no", "yes_no", [c], [c])

    return make


def _born_in_city(yes: bool) -> Make:
    def make(w: World, r: random.Random, pool: Pool) -> Question:
        p: Person = r.choice(pool["people"])
        city = p.birth_city if yes else r.choice([c.id for c in w.cities if c.id != p.birth_city])
        text = f"Was {p.name} born in {w.name(city)}?"
        return _q(text, ["yes" if yes else "no"], "yes_no", "yes_no", [p], [p])

    return make


# The templates by sampling group; each group makes up its MIX share of a split.
TEMPLATES: dict[str, dict[str, Make]] = {
    "single_hop": {
        "birthplace": _birthplace,
        "birth_year": _birth_year,
        "director": _director,
        "release_year": _release_year,
        "city_country": _city_country,
        "population": _population,
        "capital": _capital,
        "founder": _founder,
        "headquarters": _headquarters,
        "founding_year": _founding_year,
    },
    "bridge_2hop": {
        "director_birthplace": _director_birthplace,
        "director_birth_year": _director_birth_year,
        "birth_country": _birth_country,
        "founder_birthplace": _founder_birthplace,
        "headquarters_country": _headquarters_country,
        "capital_population": _capital_population,
    },
    "bridge_3hop": {
        "director_birth_country": _director_birth_country,
        "founder_birth_country": _founder_birth_country,
        "birth_country_capital": _birth_country_capital,
    },
    "comparison": {
        "film_earlier": _comparison(
            "films", "year", "Which film came out first, {a} or {b}?", "film", True
        ),
        "person_older": _comparison(
            "people", "birth_year", "Who was born first, {a} or {b}?", "person", True
        ),
        "city_larger": _comparison(
            "cities",
            "population",
            "Which city has the larger population, {a} or {b}?",
            "city",
            False,
        ),
        "organisation_older": _comparison(
            "organisations", "founded", "Which was founded first, {a} or {b}?", "organisation", True
        ),
    },
    # Yes and no are sampled as groups of their own, so that "yes" questions running out of
    # subjects (each city is in one country only) cannot tilt the balance towards "no".
    **{
        answer: {
            "same_birthplace": _same_birthplace(answer == "yes"),
            "city_in_country": _city_in_country(answer == "yes"),
            "born_in_city": _born_in_city(answer == "yes"),
        }
        for answer in ("yes", "no")
    },
}
MIX = {
    "single_hop": 0.30,
    "bridge_2hop": 0.30,
    "bridge_3hop": 0.15,
    "comparison": 0.15,
    "yes": 0.05,
    "no": 0.05,
}


def subject_pools(world: World, seed: int, holdout: float) -> dict[str, Pool]:
    """Partition every entity kind into train / dev / test subjects (disjoint)."""
    rng = random.Random(f"{seed}:subjects")
    pools: dict[str, Pool] = {split: {} for split in SPLITS}
    for kind in KINDS:
        entities = list(getattr(world, kind))
        rng.shuffle(entities)
        n_held = max(1, round(holdout * len(entities)))
        if len(entities) < 2 * n_held + 1:
            raise ValueError(
                f"too few {kind} ({len(entities)}) to hold out {n_held} for dev and test"
            )
        pools["dev"][kind] = entities[:n_held]
        pools["test"][kind] = entities[n_held : 2 * n_held]
        pools["train"][kind] = entities[2 * n_held :]
    return pools


def _sample_split(
    world: World, rng: random.Random, pool: Pool, split: str, n: int
) -> list[Question]:
    groups = list(MIX)
    questions: list[Question] = []
    seen: set[str] = set()
    misses = 0  # groups in a row that yielded no new question: the split is exhausted
    while len(questions) < n and misses < 20:
        group = rng.choices(groups, [MIX[g] for g in groups])[0]
        misses += 1
        # Retry within the group, so a template running out of subjects shifts weight to its
        # siblings and the group keeps its share.
        for _ in range(100):
            relation = rng.choice(list(TEMPLATES[group]))
            draft = TEMPLATES[group][relation](world, rng, pool)
            if draft is not None and draft.question not in seen:
                seen.add(draft.question)
                qid = f"tiny-{split}-{len(questions):05d}"
                questions.append(dataclasses.replace(draft, id=qid, relation=relation))
                misses = 0
                break
    if len(questions) < n:
        raise ValueError(
            f"could make only {len(questions)} distinct {split} questions of {n} asked: "
            "make the world larger or the split smaller"
        )
    return questions


def make_questions(
    world: World, seed: int, sizes: SplitSizes = SplitSizes()
) -> dict[str, list[Question]]:
    """Train, dev and test questions; dev and test subjects never start a train question."""
    sizes.validate()
    pools = subject_pools(world, seed, sizes.holdout)
    return {
        split: _sample_split(
            world,
            random.Random(f"{seed}:questions:{split}"),
            pools[split],
            split,
            getattr(sizes, split),
        )
        for split in SPLITS
    }
