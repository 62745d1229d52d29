"""The tiny world: generator, questions, tokenizer, model and the built folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_greedy import vllm_greedy

from common.tinyworld import (
    City,
    Country,
    Film,
    Organisation,
    Person,
    SplitSizes,
    World,
    WorldSizes,
    build_world,
    describe,
    documents,
    generate_world,
    load_world,
    make_questions,
    permute_names,
)
from common.tinyworld.model import build_model, padded_vocab_size, save_model_folder
from common.tinyworld.model_sizes import DEFAULT_MODEL_SIZES
from common.tinyworld.questions import MIX, SPLITS, TEMPLATES, subject_pools
from common.tinyworld.tokenizer import SPECIAL_TOKENS, TAGS, build_tokenizer

REPO = Path(__file__).resolve().parents[1]
SMALL = WorldSizes(people=60, cities=20, countries=10, films=30, organisations=10)
SMALL_SPLITS = SplitSizes(train=150, dev=20, test=20)


def hand_world() -> World:
    return World(
        seed=0,
        people=(
            Person("person-0000", "Vorelin Kasto", "city-0000", 1952),
            Person("person-0001", "Amsel Tor", "city-0001", 1960),
            Person("person-0002", "Bira Lun", "city-0000", 1930),
        ),
        cities=(
            City("city-0000", "Tarnu", "country-0000", 412000),
            City("city-0001", "Opal", "country-0001", 98000),
        ),
        countries=(
            Country("country-0000", "Velmora", "city-0000"),
            Country("country-0001", "Kesh", "city-0001"),
        ),
        films=(
            Film("film-0000", "Glass Orchard", "person-0000", 1987),
            Film("film-0001", "Salt Meridian", "person-0001", 1985),
        ),
        organisations=(
            Organisation("org-0000", "Velorix Labs", "company", "person-0001", "city-0000", 1990),
        ),
    )


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default-size world, built once."""
    return build_world(tmp_path_factory.mktemp("tiny") / "world", seed=0)


@pytest.fixture(scope="session")
def built_questions(built: Path) -> dict[str, list[dict]]:
    return {s: [json.loads(x) for x in (built / f"{s}.jsonl").open()] for s in SPLITS}


@pytest.fixture(scope="session")
def corpus(built: Path) -> dict[str, str]:
    rows = [json.loads(x) for x in (built / "corpus.jsonl").open()]
    return {r["id"]: r["contents"] for r in rows}


# --- the knowledge base ---------------------------------------------------------------------


def test_documents_of_a_hand_built_world() -> None:
    docs = {d.id: d.contents for d in documents(hand_world())}
    assert docs["person-0000"] == '"Vorelin Kasto"\nVorelin Kasto was born in Tarnu in 1952.'
    assert docs["city-0000"] == '"Tarnu"\nTarnu is a city in Velmora with a population of 412,000.'
    assert docs["country-0001"] == '"Kesh"\nKesh is a country whose capital is Opal.'
    assert (
        docs["film-0000"]
        == '"Glass Orchard"\nGlass Orchard is a 1987 film directed by Vorelin Kasto.'
    )
    assert docs["org-0000"] == (
        '"Velorix Labs"\nVelorix Labs is a company founded by Amsel Tor in 1990. '
        "It is headquartered in Tarnu."
    )
    assert len(docs) == 10


def test_default_world_is_consistent() -> None:
    w = generate_world(0)
    assert (len(w.people), len(w.cities), len(w.countries), len(w.films), len(w.organisations)) == (
        600,
        100,
        50,
        300,
        100,
    )
    assert w.people[42].id == "person-0042"
    names = [e.name for e in w.entities.values()]
    assert len(set(names)) == len(names)
    # Every word of a name belongs to one entity kind only, so name queries are unambiguous.
    kinds = {}
    for kind in ("people", "cities", "countries", "films"):
        for entity in getattr(w, kind):
            for word in entity.name.split():
                assert kinds.setdefault(word, kind) == kind
    for country in w.countries:
        assert w.entities[country.capital].country == country.id
    assert len({c.population for c in w.cities}) == len(w.cities)
    for film in w.films:
        born = w.entities[film.director].birth_year
        assert born + 25 <= film.year <= 2023
    for org in w.organisations:
        assert w.entities[org.founder].birth_year + 22 <= org.founded <= 2023
        assert org.headquarters in w.entities


def test_invented_words_are_no_stopwords() -> None:
    from bm25s.stopwords import STOPWORDS_EN_PLUS

    for seed in range(3):
        words = {w.lower() for e in generate_world(seed).entities.values() for w in e.name.split()}
        assert not words & set(STOPWORDS_EN_PLUS)


def test_same_seed_same_world_other_seed_other_world() -> None:
    assert generate_world(3, SMALL) == generate_world(3, SMALL)
    assert generate_world(3, SMALL).people != generate_world(4, SMALL).people
    w = generate_world(3, SMALL)
    assert make_questions(w, 3, SMALL_SPLITS) == make_questions(w, 3, SMALL_SPLITS)
    assert make_questions(w, 3, SMALL_SPLITS) != make_questions(w, 4, SMALL_SPLITS)


def test_permuted_names_keep_the_structure_and_change_every_named_fact() -> None:
    w = generate_world(0)
    r = permute_names(w, 1)
    assert r == permute_names(w, 1) and r != permute_names(w, 2)
    for kind in ("people", "cities", "countries", "films", "organisations"):
        old, new = getattr(w, kind), getattr(r, kind)
        assert sorted(e.name for e in old) == sorted(e.name for e in new)  # the same names
        moved = sum(a.name != b.name for a, b in zip(old, new, strict=True))
        assert moved >= 0.9 * len(old), kind  # nearly every entity has another's name
        for a, b in zip(old, new, strict=True):  # ids, relations, years and sizes kept
            assert dataclasses.replace(b, **{"title" if kind == "films" else "name": a.name}) == a
    for a, b in zip(w.organisations, r.organisations, strict=True):  # a university's suffix
        assert b.name in {o.name for o in w.organisations if o.kind == a.kind}
    # a named fact: where a person, by name, was born
    born = {p.name: w.name(p.birth_city) for p in w.people}
    reborn = {p.name: r.name(p.birth_city) for p in r.people}
    assert sum(born[n] == reborn[n] for n in born) < 0.05 * len(born)
    # the questions follow: the same structure, other names in them and in their answers
    qs, rq = make_questions(w, 0, SMALL_SPLITS), make_questions(r, 0, SMALL_SPLITS)
    assert [q.supporting_ids for q in qs["dev"]] == [q.supporting_ids for q in rq["dev"]]
    pairs = zip(qs["dev"], rq["dev"], strict=True)
    changed = [a.golden_answers != b.golden_answers for a, b in pairs]
    assert sum(changed) > len(changed) / 2


def test_generator_leaves_global_random_alone() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    make_questions(generate_world(1, SMALL), 1, SMALL_SPLITS)
    assert random.random() == expected


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="countries"):
        generate_world(0, WorldSizes(cities=10, countries=20))
    with pytest.raises(ValueError, match="WorldSizes.films"):
        generate_world(0, WorldSizes(films=0))
    with pytest.raises(ValueError, match="could make only"):
        make_questions(generate_world(0, SMALL), 0, SplitSizes(train=100, dev=5000, test=10))
    with pytest.raises(ValueError, match="holdout"):
        make_questions(generate_world(0, SMALL), 0, SplitSizes(holdout=0.6))


def test_world_json_round_trip_and_bad_file(built: Path, tmp_path: Path) -> None:
    assert load_world(built / "world.json") == generate_world(0)
    bad = tmp_path / "world.json"
    bad.write_text(json.dumps({"seed": 0, "people": []}))
    with pytest.raises(ValueError, match=re.escape(str(bad))):
        load_world(bad)


# --- questions -------------------------------------------------------------------------------


def _only(w: World, **chosen: list) -> dict[str, list]:
    return {
        k: chosen.get(k, list(getattr(w, k)))
        for k in ("people", "cities", "countries", "films", "organisations")
    }


def test_templates_on_a_hand_built_world() -> None:
    w = hand_world()
    rng = random.Random(0)
    film = w.films[0]
    q = TEMPLATES["bridge_3hop"]["director_birth_country"](w, rng, _only(w, films=[film]))
    assert q.question == "In which country was the director of Glass Orchard born?"
    assert q.golden_answers == ("Velmora",)
    assert q.gold_queries == ("Glass Orchard", "Vorelin Kasto", "Tarnu")
    assert q.supporting_ids == ("film-0000", "person-0000", "city-0000")
    assert (q.type, q.hops, q.answer_type, q.subjects) == ("bridge", 3, "country", ("film-0000",))

    q = TEMPLATES["bridge_2hop"]["capital_population"](w, rng, _only(w, countries=[w.countries[1]]))
    assert q.golden_answers == ("98,000", "98000")
    assert q.gold_queries == ("Kesh", "Opal")

    q = TEMPLATES["comparison"]["film_earlier"](w, rng, w_pool := _only(w))
    assert q.golden_answers == ("Salt Meridian",)
    assert set(q.gold_queries) == {"Glass Orchard", "Salt Meridian"}
    assert q.question.startswith("Which film came out first, ")
    q = TEMPLATES["comparison"]["city_larger"](w, rng, w_pool)
    assert q.golden_answers == ("Tarnu",)

    vorelin, amsel, bira = w.people
    q = TEMPLATES["yes"]["same_birthplace"](w, rng, _only(w, people=[vorelin, bira]))
    assert q.golden_answers == ("yes",)
    assert q.gold_queries in (("Vorelin Kasto", "Bira Lun"), ("Bira Lun", "Vorelin Kasto"))
    q = TEMPLATES["no"]["same_birthplace"](w, rng, _only(w, people=[vorelin, amsel]))
    assert q.golden_answers == ("no",)
    assert TEMPLATES["no"]["same_birthplace"](w, rng, _only(w, people=[vorelin, bira])) is None
    q = TEMPLATES["no"]["city_in_country"](w, rng, _only(w, cities=[w.cities[0]]))
    assert (q.question, q.golden_answers) == ("Is Tarnu in Kesh?", ("no",))


def test_flashrag_rows(built_questions: dict[str, list[dict]]) -> None:
    row = built_questions["train"][12]
    assert row["id"] == "tiny-train-00012"
    assert set(row) == {"id", "question", "golden_answers", "metadata"}
    assert {"type", "hops", "gold_queries", "supporting_ids", "answer_type"} <= set(row["metadata"])
    for split, rows in built_questions.items():
        assert len(rows) == {"train": 4000, "dev": 500, "test": 500}[split]
        assert len({r["question"] for r in rows}) == len(rows)
        for r in rows:
            meta = r["metadata"]
            assert len(meta["gold_queries"]) == len(meta["supporting_ids"]) == meta["hops"]


def test_mix_of_kinds(built_questions: dict[str, list[dict]]) -> None:
    rows = built_questions["train"]
    n = len(rows)
    shares = {
        "yes": sum(r["golden_answers"] == ["yes"] for r in rows) / n,
        "no": sum(r["golden_answers"] == ["no"] for r in rows) / n,
        "bridge_3hop": sum(r["metadata"]["hops"] == 3 for r in rows) / n,
        "single_hop": sum(r["metadata"]["type"] == "single_hop" for r in rows) / n,
        "comparison": sum(r["metadata"]["type"] == "comparison" for r in rows) / n,
    }
    for group, share in shares.items():
        p = MIX[group]
        assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / n), (group, share)


def test_dev_and_test_subjects_never_start_train_questions(
    built_questions: dict[str, list[dict]],
) -> None:
    subjects = {
        s: {x for r in rows for x in r["metadata"]["subjects"]}
        for s, rows in built_questions.items()
    }
    assert not subjects["train"] & subjects["dev"]
    assert not subjects["train"] & subjects["test"]
    assert not subjects["dev"] & subjects["test"]
    pools = subject_pools(generate_world(0), 0, 0.1)
    assert len(pools["test"]["people"]) == 60
    assert len(pools["test"]["countries"]) == 5


def test_every_answer_is_in_a_supporting_document(
    built_questions: dict[str, list[dict]], corpus: dict[str, str]
) -> None:
    for rows in built_questions.values():
        for r in rows:
            meta = r["metadata"]
            texts = [corpus[i].split("\n", 1)[1] for i in meta["supporting_ids"]]
            if meta["type"] != "yes_no":
                assert any(r["golden_answers"][0] in t for t in texts), r
                continue
            birthplaces = [re.search(r"born in (\w+)", t) for t in texts]
            if meta["relation"] == "same_birthplace":
                same = birthplaces[0].group(1) == birthplaces[1].group(1)
            else:
                # "Is C in K?" / "Was X born in C?": the single document names the place or not.
                place = r["question"].rstrip("?").split(" in ")[-1]
                same = f" {place} " in texts[0] or f" {place}." in texts[0]
            assert r["golden_answers"] == (["yes"] if same else ["no"]), r


def test_gold_queries_find_their_documents_with_bm25(
    built_questions: dict[str, list[dict]], corpus: dict[str, str]
) -> None:
    import bm25s

    ids = list(corpus)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize(list(corpus.values()), stopwords="en", show_progress=False),
        show_progress=False,
    )
    targets = {}
    for rows in built_questions.values():
        for r in rows:
            targets.update(
                zip(r["metadata"]["gold_queries"], r["metadata"]["supporting_ids"], strict=True)
            )
    queries = list(targets)
    assert len(queries) > 1000
    found, _ = retriever.retrieve(
        bm25s.tokenize(queries, stopwords="en", show_progress=False), k=3, show_progress=False
    )
    missed = [
        q for q, row in zip(queries, found, strict=True) if targets[q] not in {ids[i] for i in row}
    ]
    assert missed == []


# --- tokenizer -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(built: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(built / "model")


def test_tags_and_specials_are_single_tokens(tokenizer) -> None:
    assert len(tokenizer) == 2048
    assert tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2]
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 2
    for tag in TAGS:
        ids = tokenizer.encode(f"x{tag}y", add_special_tokens=False)
        assert tokenizer.convert_tokens_to_ids(tag) in ids
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    text = "<search> Vorelin Kasto </search>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<search>")
    assert ids[-1] == tokenizer.convert_tokens_to_ids("</search>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template(tokenizer) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = tokenizer.apply_chat_template(messages, tokenize=False)
    assert plain == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"


@settings(max_examples=200)
@given(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(TAGS)), max_size=6))
def test_any_text_round_trips(tokenizer, pieces: list[str]) -> None:
    text = "".join(pieces)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_split_digits_makes_every_digit_a_token() -> None:
    texts = [d.contents for d in documents(generate_world(5, SMALL))]
    split = build_tokenizer(texts * 3, vocab_size=1200, split_digits=True)
    text = "Tusha Shusti was born in Chutrar in 1951; population 2,795,000."
    pieces = split.convert_ids_to_tokens(split.encode(text, add_special_tokens=False))
    digits = [p for p in pieces if any(ch.isdigit() for ch in p)]
    assert digits == list("1951") + list("2795000")
    assert split.decode(split.encode(text, add_special_tokens=False)) == text
    # without the option (the default) a frequent year is one token
    plain = build_tokenizer(texts * 3, vocab_size=1200)
    years = [p for p in plain.convert_ids_to_tokens(plain.encode(texts[0])) if p[-4:].isdigit()]
    assert years and all(len(p.lstrip("Ġ")) == 4 for p in years)


def test_isolate_spaces_gives_a_word_one_tokenization_wherever_it_stands() -> None:
    texts = [d.contents for d in documents(generate_world(5, SMALL))] * 3
    iso = build_tokenizer(texts, vocab_size=600, isolate_spaces=True)

    def tail(tok, text: str, word: str) -> list[int]:
        ids = tok.encode(text, add_special_tokens=False)
        n = len(tok.encode(word, add_special_tokens=False))
        return ids[-n:]

    for word in ("Shusti", "1951", "2,795,000"):
        forms = [f" {word}", f"{{{word}", word, f"was born in {word}"]
        assert all(tail(iso, f, word) == iso.encode(word, add_special_tokens=False) for f in forms)
        assert iso.decode(iso.encode(forms[3], add_special_tokens=False)) == forms[3]
    pieces = iso.convert_ids_to_tokens(iso.encode(" in 1951", add_special_tokens=False))
    assert pieces[0] == "Ġ" and pieces[2] == "Ġ"  # each space a token of its own
    # without the option (the default) the space is part of the word's first token
    plain = build_tokenizer(texts, vocab_size=600)
    assert plain.convert_ids_to_tokens(plain.encode(" in", add_special_tokens=False)) == ["Ġin"]
    spaced, bare = (plain.encode(w, add_special_tokens=False) for w in (" Shusti", "Shusti"))
    assert spaced[0] != bare[0]


def test_tokenizer_training_is_deterministic() -> None:
    texts = [d.contents for d in documents(generate_world(5, SMALL))]
    first = build_tokenizer(texts, vocab_size=600).backend_tokenizer.to_str()
    assert build_tokenizer(texts, vocab_size=600).backend_tokenizer.to_str() == first
    assert build_tokenizer(texts[:-5], vocab_size=600).backend_tokenizer.to_str() != first
    with pytest.raises(ValueError, match="vocab_size"):
        build_tokenizer(texts, vocab_size=100)


# --- model -----------------------------------------------------------------------------------


def test_padded_vocab_size() -> None:
    assert [padded_vocab_size(n) for n in (1, 64, 65, 2048, 2049)] == [64, 64, 128, 2048, 2112]


def test_model_shape_and_seeded_init(tokenizer) -> None:
    torch.manual_seed(7)
    expected_next = torch.rand(1)
    torch.manual_seed(7)
    model = build_model(tokenizer, seed=3)
    assert torch.equal(torch.rand(1), expected_next)  # the caller's RNG is untouched
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (
        2,
        128,
        4,
        2,
    )
    assert (c.head_dim, c.intermediate_size, c.vocab_size, c.max_position_embeddings) == (
        32,
        384,
        2048,
        2048,
    )
    assert model.lm_head.weight is model.model.embed_tokens.weight
    # embeddings 2048*128; per layer q,o 128*128, k,v 128*64, MLP 3*128*384, norms 2*128 + 2*32;
    # final norm 128.
    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384 + 2 * 128 + 2 * 32
    assert sum(p.numel() for p in model.parameters()) == 2048 * 128 + 2 * per_layer + 128 == 656_128
    again = build_model(tokenizer, seed=3).state_dict()
    other = build_model(tokenizer, seed=4).state_dict()
    for name, weight in model.state_dict().items():
        assert torch.equal(weight, again[name])
    assert not torch.equal(
        model.state_dict()["model.layers.0.mlp.up_proj.weight"],
        other["model.layers.0.mlp.up_proj.weight"],
    )
    with pytest.raises(ValueError, match="hidden"):
        build_model(tokenizer, seed=0, hiddn_size=64)


def test_saved_model_loads_and_generates(built: Path, tokenizer, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(built / "model")
    assert model.dtype == torch.float32
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (
        0,
        2,
        0,
    )
    fresh = build_model(tokenizer, seed=0)
    prompt = tokenizer("<search> Vorelin Kasto </search>", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 4)
    assert torch.equal(out, fresh.generate(**prompt, max_new_tokens=4, do_sample=False))
    config = json.loads(
        (save_model_folder(fresh, tokenizer, tmp_path) / "tokenizer_config.json").read_text()
    )
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


# --- the built folder ------------------------------------------------------------------------


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_build_is_byte_identical_across_processes(built: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    cmd = [sys.executable, "-m", "common.tinyworld", "build", "--out", str(out), "--seed", "0"]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=120)
    assert _digests(out) == _digests(built)
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["files"] == {k: v for k, v in _digests(built).items() if k != "manifest.json"}
    assert set(manifest["files"]) >= {
        "world.json",
        "corpus.jsonl",
        "train.jsonl",
        "dev.jsonl",
        "test.jsonl",
        "model/model.safetensors",
        "model/config.json",
        "model/generation_config.json",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
    }


def test_other_seed_other_bytes_and_rebuild_in_place(tmp_path: Path) -> None:
    out = tmp_path / "w"
    build_world(out, seed=1, sizes=SMALL, splits=SMALL_SPLITS)
    first = _digests(out)
    build_world(out, seed=2, sizes=SMALL, splits=SMALL_SPLITS)
    second = _digests(out)
    assert set(first) == set(second)
    assert all(
        first[name] != second[name]
        for name in ("world.json", "corpus.jsonl", "train.jsonl", "model/model.safetensors")
    )
    assert not list(tmp_path.glob(".w.tmp-*"))


def test_renamed_build_writes_the_permuted_world(tmp_path: Path) -> None:
    out = build_world(tmp_path / "w", seed=0, sizes=SMALL, splits=SMALL_SPLITS, rename_seed=1)
    assert json.loads((out / "manifest.json").read_text())["rename_seed"] == 1
    want = documents(permute_names(generate_world(0, SMALL), 1))
    rows = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert rows == [{"id": d.id, "contents": d.contents} for d in want]
    assert load_world(out / "world.json") == permute_names(generate_world(0, SMALL), 1)


def test_model_sizes_are_built_and_recorded(tmp_path: Path) -> None:
    sizes = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128}
    out = build_world(tmp_path / "w", seed=0, sizes=SMALL, splits=SMALL_SPLITS, model_sizes=sizes)
    config = json.loads((out / "model" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        1,
        64,
        128,
    )
    recorded = json.loads((out / "manifest.json").read_text())["model_sizes"]
    assert recorded == {**DEFAULT_MODEL_SIZES, **sizes}


def test_build_refuses_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tiny-world build"):
        build_world(tmp_path, seed=0, sizes=SMALL, splits=SMALL_SPLITS)
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model_sizes": {"hidden_size": 0}}, "model sizes must be integers >= 1: hidden_size=0"),
        (
            {"model_sizes": {"num_key_value_heads": 3}},
            "num_attention_heads \\(4\\) must be a multiple",
        ),
        ({"model_sizes": {"width": 8}}, "unknown model size"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"rename_seed": -1}, "rename_seed must be >= 0"),
        ({"splits": SplitSizes(train=0)}, "SplitSizes.train must be at least 1"),
    ],
)
def test_bad_build_options_fail_before_any_work(tmp_path: Path, options, message) -> None:
    """A model with a zero-width layer used to be built and saved without complaint."""
    with pytest.raises(ValueError, match=message):
        build_world(tmp_path / "w", **{"seed": 0, "sizes": SMALL, **options})
    assert not (tmp_path / "w").exists() and list(tmp_path.iterdir()) == []


def test_cli_show_and_errors(built: Path) -> None:
    text = describe(built)
    assert "people           600" in text and "test: 500 questions" in text
    assert "tiny-test-00000" in text
    bad = subprocess.run(
        [sys.executable, "-m", "common.tinyworld", "build", "--out", "/nonexistent/x", "--cities", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert "countries (50) must not exceed cities (5)" in bad.stderr


# --- vLLM ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vllm_loads_the_model_folder_and_matches_hf(built: Path, tokenizer) -> None:
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    prompt = tokenizer.encode("<search> Vorelin Kasto </search>", add_special_tokens=False)
    result = vllm_greedy(built / "model", prompt)
    print(f"vLLM import {result['import_s']:.1f}s, engine start {result['engine_s']:.1f}s")

    model = AutoModelForCausalLM.from_pretrained(built / "model")
    ids = torch.tensor([prompt + result["ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]  # [8, vocab]
    hf = torch.log_softmax(logits, dim=-1)
    assert result["ids"] == hf.argmax(-1).tolist()
    expected = hf.gather(1, torch.tensor(result["ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(result["logprobs"]), expected, atol=1e-4)
    assert result["text"] == tokenizer.decode(result["ids"])
