from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from cer.data import load_math_examples
from cer.rewards.answer import last_boxed
from cer.rewards.groups import is_correct, is_exact, verifier_name
from cer.rewards.verifiers import alias_verifier, exact_verifier, normalize_alias
from cer.tasks.alias import (
    DOCUMENTS_FILE,
    SUBJECT_OF,
    build,
    count_forms,
    held_out_ids,
    holdout_pools,
    main,
    person_forms,
    population_forms,
    shared_world,
)

FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "warmup.jsonl", "meta.json")
KINDS = {"director", "founder", "count", "population", "birth_year", "capital"}


@pytest.fixture(scope="module", params=["fresh", "shared", "shared-names"])
def task(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"alias_{request.param}")
    return build(out, seed=3, n_train=300, n_dev=60, n_test=60, worlds=request.param)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_same_seed_same_bytes(task, tmp_path):
    worlds = json.loads((task / "meta.json").read_text()).get("worlds", "fresh")
    argv = ["build", "--out", str(tmp_path), "--seed", "3", "--worlds", worlds]
    main(argv + ["--n-train", "300", "--n-dev", "60", "--n-test", "60"])
    names = FILES + ((DOCUMENTS_FILE,) if worlds != "fresh" else ())
    assert (task / DOCUMENTS_FILE).is_file() == (worlds != "fresh")
    for name in names:
        assert (tmp_path / name).read_bytes() == (task / name).read_bytes(), name
    other = build(tmp_path / "other", seed=4, n_train=300, n_dev=60, n_test=60, worlds=worlds)
    assert (other / "train.jsonl").read_bytes() != (task / "train.jsonl").read_bytes()


# sha256 of the fresh-world build (seed 3, 300/60/60) before the shared option was added: the
# old behaviour, on which the README's first warmup rows were measured, is kept byte for byte.
FRESH_SHA256 = {
    "train.jsonl": "a9a23dcbdfbc0ee9e76c6e02511d5e66209d44f44397af2084b84b280222b429",
    "dev.jsonl": "55c8bc9ed4cddf20ae4eede76859c7df6bbebbc2ed0b1bd1f2c19e0629b24cf2",
    "warmup.jsonl": "2a57c38016eb74dd664a82da50d2832dbf681a6554ecba7c4695b32245cb11e7",
    "meta.json": "759ce7bb4785ce4f151cc93ff306c0b7b129565682784d0afce970a0171a93ee",
}


def test_the_fresh_build_is_the_one_measured_before(tmp_path):
    out = build(tmp_path, seed=3, n_train=300, n_dev=60, n_test=60, worlds="fresh")
    for name, digest in FRESH_SHA256.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


QUESTION_SUBJECT = {
    "director": r"Who directed (.+)\?",
    "founder": r"Who founded (.+)\?",
    "count": r"How many films in the context did (.+) direct\?",
    "population": r"What is the population of (.+)\?",
    "birth_year": r"In which year was (.+) born\?",
    "capital": r"What is the capital of (.+)\?",
}


def _names_regex(names) -> re.Pattern:
    return re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")


@pytest.fixture(
    scope="module",
    params=[("shared", "asked"), ("shared-names", "asked"), ("shared-names", "subjects")],
)
def shared(request, tmp_path_factory) -> Path:
    worlds, holdout = request.param
    out = tmp_path_factory.mktemp(f"{worlds}_{holdout}")
    return build(out, 5, 400, 80, 80, worlds=worlds, name_holdout=holdout)


def test_shared_world_holds_dev_and_test_entities_out_of_train(shared):
    meta = json.loads((shared / "meta.json").read_text())
    world = shared_world(5)
    pools = holdout_pools(world, 5)
    held = {s: held_out_ids(pools, s) for s in ("dev", "test")}
    assert not held["dev"] & held["test"] and all(len(h) >= 50 for h in held.values())
    train_pool = held_out_ids(pools, "train")
    assert not train_pool & (held["dev"] | held["test"])
    held_names = {s: {world.name(i) for i in held[s]} for s in held}
    rows = {s: _rows(shared / f"{s}.jsonl") for s in ("train", "dev", "test")}
    held_regex = _names_regex(held_names["dev"] | held_names["test"])
    if meta.get("name_holdout") == "asked":
        # No train problem asks about a dev or test entity (its name may stand in the context,
        # with the facts of its small world).
        for row in rows["train"]:
            question = row["problem"].split("\nQuestion: ")[1]
            subject = re.fullmatch(QUESTION_SUBJECT[row["kind"]], question).group(1)
            assert subject not in held_names["dev"] | held_names["test"], row
        train_text = "\n".join(r["problem"] for r in rows["train"])
        assert held_regex.search(train_text)  # the names themselves are not kept out
    else:
        # No train problem names a dev or test entity anywhere: subject, distractor, director, ...
        train_text = "\n".join(r["problem"] for r in rows["train"])
        assert not held_regex.search(train_text)
    # Every dev (test) problem asks about a dev (test) entity of its kind and names none of the
    # other held-out split's.
    for split, other in (("dev", "test"), ("test", "dev")):
        other_names = _names_regex(held_names[other])
        kinds = set()
        for row in rows[split]:
            question = row["problem"].split("\nQuestion: ")[1]
            subject = re.fullmatch(QUESTION_SUBJECT[row["kind"]], question).group(1)
            pool = {e.name for e in pools[split][SUBJECT_OF[row["kind"]]]}
            assert subject in pool, (split, row)
            assert not other_names.search(row["problem"]), (split, row)
            kinds.add(row["kind"])
        assert kinds == KINDS
    # The warmup is on train problems only.
    warm = {r["problem"] for r in _rows(shared / "warmup.jsonl")}
    assert warm == {r["problem"] for r in rows["train"]}


def test_shared_world_documents_are_the_tokenizer_corpus_without_dev_or_test_problems(shared):
    from cer.tasks.build import tokenizer_texts

    docs = _rows(shared / DOCUMENTS_FILE)
    world = shared_world(5)
    assert len(docs) == sum(
        len(getattr(world, k)) for k in ("people", "cities", "countries", "films", "organisations")
    )
    texts = tokenizer_texts(shared)
    joined = "\n".join(texts)
    assert all(d["text"] in joined for d in docs[:50])
    for split in ("dev", "test"):
        for row in _rows(shared / f"{split}.jsonl"):
            question = row["problem"].split("\nQuestion: ")[1]
            assert question not in joined and row["problem"] not in joined
    meta = json.loads((shared / "meta.json").read_text())
    assert meta["worlds"] in ("shared", "shared-names") and meta["holdout"] == 0.1
    assert meta["sizes"] == {"train": 400, "dev": 80, "test": 80}


def test_splits_are_disjoint_sized_and_mixed(task):
    problems = {
        name: {r["problem"] for r in _rows(task / f"{name}.jsonl")}
        for name in ("train", "dev", "test")
    }
    assert [len(p) for p in problems.values()] == [300, 60, 60]
    assert not problems["train"] & problems["dev"]
    assert not problems["train"] & problems["test"]
    assert not problems["dev"] & problems["test"]
    meta = json.loads((task / "meta.json").read_text())
    assert meta["task"] == "alias" and meta["sizes"] == {"train": 300, "dev": 60, "test": 60}
    assert set(meta["kinds"]) == KINDS
    assert meta["with_aliases"] > 0.5


def test_rows_have_the_loader_fields_and_their_answer_in_the_context(task):
    for row in _rows(task / "dev.jsonl"):
        assert set(row) == {"id", "kind", "problem", "answer", "answer_forms", "verifier"}
        assert row["verifier"] == "alias" and row["answer"] == row["answer_forms"][0]
        context, question = row["problem"].split("\nQuestion: ")
        assert context.startswith("Context: ") and question.endswith("?")
        if row["kind"] != "count":
            assert row["answer"] in context, row
        for form in row["answer_forms"]:
            assert alias_verifier(form, row["answer_forms"])


def test_warmup_answers_are_forms_and_often_defeat_exact_match(task):
    train = {r["id"]: r for r in _rows(task / "train.jsonl")}
    warm = _rows(task / "warmup.jsonl")
    assert len(warm) == len(train)
    differ = 0
    for row in warm:
        gold = train[row["id"]]
        assert row["problem"] == gold["problem"]
        assert last_boxed(row["solution"]) == row["answer"]
        assert row["answer"] in gold["answer_forms"]
        assert alias_verifier(row["answer"], gold["answer_forms"])
        differ += not exact_verifier(row["answer"], gold["answer"])
    assert differ / len(warm) > 0.2


def test_splits_load_and_the_rule_is_the_alias_oracle(task):
    examples = load_math_examples(task / "dev.jsonl", source="").examples
    assert len(examples) == 60 and examples[0].id == "alias-dev-00000"
    warm = load_math_examples(task / "warmup.jsonl").examples
    assert len(warm) == 300 and "\\boxed{" in warm[0].metadata["solution"]
    aliased = next(ex for ex in examples if len(ex.metadata["answer_forms"]) > 1)
    alias = aliased.metadata["answer_forms"][1]
    assert verifier_name(aliased) == "alias"
    assert is_correct(alias, aliased) and not is_exact(alias, aliased)
    assert is_correct(aliased.answer, aliased) and is_exact(aliased.answer, aliased)
    assert not is_correct(None, aliased) and not is_correct("Nobody", aliased)


PERSON = ["Tusha Shusti", "Shusti"]


@pytest.mark.parametrize(
    ("answer", "forms", "ok"),
    [
        ("Tusha Shusti", PERSON, True),  # canonical
        ("Shusti", PERSON, True),  # surname alias
        ("tusha  shusti", PERSON, True),  # case and whitespace
        ("\\text{Shusti}.", PERSON, True),  # wrapper and trailing period
        ("$Tusha Shusti$", PERSON, True),
        ("Tusha", PERSON, False),  # a given name alone is not a listed form
        ("Shusti Tusha", PERSON, False),
        ("Tusha Shust", PERSON, False),
        ("Tusha Shusti Bo", PERSON, False),
        ("Kem Shusa", PERSON, False),  # another person
        ("", PERSON, False),
        ("2", ["2", "two"], True),
        ("two", ["2", "two"], True),
        ("Two", ["2", "two"], True),
        ("3", ["2", "two"], False),
        ("2.0", ["2", "two"], False),
        ("2,795,000", ["2,795,000", "2795000"], True),
        ("2795000", ["2,795,000", "2795000"], True),
        ("2,795", ["2,795,000", "2795000"], False),
        ("2795", ["2,795,000", "2795000"], False),
    ],
)
def test_alias_oracle(answer, forms, ok):
    assert alias_verifier(answer, forms) is ok


def test_exact_rejects_an_alias_the_oracle_accepts():
    for forms in (PERSON, ["2", "two"], ["2,795,000", "2795000"]):
        assert exact_verifier(forms[0], forms[0])
        assert not exact_verifier(forms[1], forms[0])
        assert alias_verifier(forms[1], forms)


def test_forms_and_normalisation():
    assert person_forms("Tusha Shusti") == ("Tusha Shusti", "Shusti")
    assert count_forms(3) == ("3", "three") and count_forms(12) == ("12",)
    assert population_forms(2795000) == ("2,795,000", "2795000")
    assert normalize_alias(" $\\text{Tusha   SHUSTI}$. ") == "tusha shusti"
    assert normalize_alias("1,000 and 2, 3") == "1000 and 2, 3"


def test_unknown_worlds_and_name_holdout_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown worlds 'one'"):
        build(tmp_path, 0, 10, 5, 5, worlds="one")
    with pytest.raises(ValueError, match="unknown name hold-out 'all'"):
        build(tmp_path, 0, 10, 5, 5, worlds="shared-names", name_holdout="all")


def test_default_build_is_shared_names_with_13000_train_problems():
    import inspect

    from cer.tasks.alias import DEFAULT_N_TRAIN

    params = inspect.signature(build).parameters
    assert params["worlds"].default == "shared-names" and params["name_holdout"].default == "asked"
    assert params["n_train"].default is None and DEFAULT_N_TRAIN["shared-names"] == 13000


def test_shared_names_facts_change_with_the_world(tmp_path):
    """shared-names: the same name gets other facts in other small worlds (nothing to recall),
    the shared build's facts never change."""
    by_mode = {}
    for worlds in ("shared", "shared-names"):
        out = build(tmp_path / worlds, 5, n_train=400, n_dev=20, n_test=20, worlds=worlds)
        facts: dict[str, set[str]] = {}
        for row in _rows(out / "train.jsonl"):
            if row["kind"] in ("director", "capital", "birth_year"):
                question = row["problem"].split("\nQuestion: ")[1]
                facts.setdefault(question, set()).add(row["answer"])
        by_mode[worlds] = max(len(answers) for answers in facts.values())
    assert by_mode == {"shared": 1, "shared-names": by_mode["shared-names"]}
    assert by_mode["shared-names"] > 1


@pytest.mark.parametrize("share", [0.0, 0.9, 1.0])
def test_canonical_share_sets_how_often_the_warmup_boxes_the_canonical_form(share, tmp_path):
    out = build(tmp_path, seed=3, n_train=600, n_dev=20, n_test=20, canonical_share=share)
    train = {r["id"]: r for r in _rows(out / "train.jsonl")}
    warm = _rows(out / "warmup.jsonl")
    multi = [r for r in warm if len(train[r["id"]]["answer_forms"]) > 1]
    canonical = [r["answer"] == train[r["id"]]["answer"] for r in multi]
    share_seen = sum(canonical) / len(multi)
    # 0 and 1 are exact; 0.9 over ~400 multi-form rows is within 4 binomial sds (0.015 each)
    assert share_seen == pytest.approx(share, abs=0.06 if 0 < share < 1 else 0.0)
    for r in warm:  # single-form answers keep their one form, every box a correct form
        assert r["answer"] in train[r["id"]]["answer_forms"]
        assert last_boxed(r["solution"]) == r["answer"]
    assert json.loads((out / "meta.json").read_text())["canonical_share"] == share
    # the splits are the default build's: only the warmup's boxes change
    plain = build(tmp_path / "plain", seed=3, n_train=600, n_dev=20, n_test=20)
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (plain / name).read_bytes()
    assert "canonical_share" not in json.loads((plain / "meta.json").read_text())


def test_canonical_share_out_of_range_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"canonical_share must be in \[0, 1\], got 1.5"):
        build(tmp_path, seed=3, n_train=10, n_dev=5, n_test=5, canonical_share=1.5)
