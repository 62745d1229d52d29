"""Stand-in data for rehearsing the paper configs: a few rows in each paper data set's own layout.

One function per config family writes every file its ``assets`` section names into an out folder
and returns the overrides (dotted key -> path) that point the config at them:

    eviback_data(config, out, rows)   # FlashRAG jsonl: train, dev, eval mappings (corpus)
    cer_data(config, out, rows)       # MATH train / WebInstruct, MATH500, AMC, AIME, MMLU-Pro, SuperGPQA
    arco_data(config, out, rows)      # HotpotQA JSON, 2WikiMultiHopQA JSON, MuSiQue jsonl (corpus)

``config`` is the loaded config as a mapping (the ``defaults`` chain merged, e.g.
``common.config.config_to_dict(load_config(...))``); the functions read the data keys from it,
so a config with other sources or benchmarks works as long as each names a layout known here.

The rows come from ``samples/`` (see its README for sources and licences), cycled to ``rows``
rows per file: a repeated row gets a distinct id and its question a " (rehearsal copy N)"
suffix, so selection by normalised question still sees distinct questions. **The stand-in data
keeps formats, not facts**: every gold answer is one of ``QA_ANSWERS`` (QA), ``MATH_ANSWERS``
(math: boxed numbers) or ``CHOICE_ANSWERS`` (multiple choice), so that a scripted stand-in model
that answers from these sets is sometimes right; the real samples' answers are rewritten to them
(in their paragraphs too, so the evidence still contains the answer).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

QA_ANSWERS = ("Paris", "1912")
MATH_ANSWERS = ("2", "3")
CHOICE_ANSWERS = ("A", "B")
ANSWERS = {"qa": QA_ANSWERS, "math": MATH_ANSWERS, "choice": CHOICE_ANSWERS}
SAMPLES = Path(__file__).parent / "samples"

Row = dict[str, Any]


class AssetsError(ValueError):
    """A config data key the stand-in data cannot serve."""


# --- samples ---------------------------------------------------------------------------------


def _read_rows(name: str) -> list[Row]:
    """The rows of a samples file (a JSON list or jsonl)."""
    text = (SAMPLES / name).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def _hotpotqa_rows() -> list[Row]:
    """The HotpotQA sample, each row's answer rewritten to ``QA_ANSWERS[i % 2]`` (everywhere in
    its context), so that the supporting paragraphs state the new answer."""
    rows = []
    for i, row in enumerate(_read_rows("hotpotqa_distractor_dev_sample.jsonl")):
        old, new = row["answer"], QA_ANSWERS[i % len(QA_ANSWERS)]
        row = copy.deepcopy(row)
        row["answer"] = new
        row["context"] = [[t, [s.replace(old, new) for s in ss]] for t, ss in row["context"]]
        rows.append(row)
    return rows


def _bamboogle_rows() -> list[Row]:
    rows = _read_rows("bamboogle_sample.jsonl")
    return [{**r, "answer": QA_ANSWERS[i % len(QA_ANSWERS)]} for i, r in enumerate(rows)]


# --- cycling ---------------------------------------------------------------------------------

_ID_KEYS = ("_id", "id", "unique_id", "question_id", "uuid", "idx")


def cycle_rows(base: list[Row], n: int) -> list[Row]:
    """``n`` rows from ``base`` in turn; the k-th repeat (k >= 1) of a row gets the id
    ``"{id}-copy{k}"`` (an integer id: ``id + 100000 * k``) and its question (``question`` or
    ``problem``) the suffix " (rehearsal copy {k + 1})"."""
    if n < 1:
        raise AssetsError(f"rows must be at least 1, got {n}")
    out = []
    for i in range(n):
        row, k = copy.deepcopy(base[i % len(base)]), i // len(base)
        if k:
            key = next((key for key in _ID_KEYS if key in row), None)
            if key is not None:
                value = row[key]
                row[key] = value + 100000 * k if isinstance(value, int) else f"{value}-copy{k}"
            text_key = "question" if "question" in row else "problem"
            row[text_key] = f"{row[text_key]} (rehearsal copy {k + 1})"
        out.append(row)
    return out


def _write(path: Path, rows: list[Row]) -> str:
    """Rows as a JSON list (``.json``) or jsonl (anything else); returns the path as text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        text = json.dumps(rows, ensure_ascii=False, indent=1) + "\n"
    else:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return str(path.resolve())


def _target(out: Path, dotted: str, configured: Any) -> Path:
    """Where a key's stand-in file goes: ``out/data/<dotted key><suffix>``, the configured file's
    suffix when it is .json or .jsonl, else .jsonl."""
    suffix = Path(str(configured)).suffix
    suffix = suffix if suffix in (".json", ".jsonl") else ".jsonl"
    return out / "data" / (re.sub(r"[^A-Za-z0-9_.-]", "_", dotted) + suffix)


# --- FlashRAG (EviBack) ----------------------------------------------------------------------


def _columnar(pairs: Iterable[list], second: str) -> dict[str, list]:
    pairs = list(pairs)
    return {"title": [p[0] for p in pairs], second: [p[1] for p in pairs]}


def _flashrag_from_paragraph_row(row: Row) -> Row:
    """A HotpotQA / 2Wiki original row in FlashRAG's layout (columnar context and facts)."""
    metadata = {k: row[k] for k in ("type", "level") if k in row}
    metadata["supporting_facts"] = _columnar(row["supporting_facts"], "sent_id")
    metadata["context"] = _columnar(row["context"], "sentences")
    if "evidences" in row:
        metadata["evidences"] = row["evidences"]
    return {
        "id": row["_id"],
        "question": row["question"],
        "golden_answers": [row["answer"]],
        "metadata": metadata,
    }


def _flashrag_from_musique(row: Row) -> Row:
    keep = ("answerable", "question_decomposition", "paragraphs")
    return {
        "id": row["id"],
        "question": row["question"],
        "golden_answers": list(dict.fromkeys([row["answer"], *row.get("answer_aliases", [])])),
        "metadata": {k: row[k] for k in keep if k in row},
    }


def _flashrag_from_simple(row: Row) -> Row:
    return {
        "id": f"test_{row['idx']}",
        "question": row["question"],
        "golden_answers": [row["answer"]],
        "metadata": {},
    }


def _flashrag_pool(source: str) -> list[Row]:
    pools: dict[str, Callable[[], list[Row]]] = {
        "nq": lambda: _read_rows("open_domain_handmade.jsonl"),
        "hotpotqa": lambda: [_flashrag_from_paragraph_row(r) for r in _hotpotqa_rows()],
        "2wiki": lambda: [
            _flashrag_from_paragraph_row(r) for r in _read_rows("2wiki_handmade.json")
        ],
        "musique": lambda: [
            _flashrag_from_musique(r) for r in _read_rows("musique_handmade.jsonl")
        ],
        "bamboogle": lambda: [_flashrag_from_simple(r) for r in _bamboogle_rows()],
    }
    aliases = {"triviaqa": "nq", "popqa": "nq", "2wikimultihopqa": "2wiki"}
    name = aliases.get(source, source)
    if name not in pools:
        known = sorted([*pools, *aliases])
        raise AssetsError(f"no stand-in FlashRAG data for source {source!r} (known: {known})")
    return pools[name]()


EVIBACK_DATA = ("train", "dev", "eval", "corpus")
EVIBACK_OTHER = (
    "model", "train_quotas", "eval_quotas", "selection", "train_selection_seed",
    "eval_selection_seed", "release_names", "retrieval_url", "retrieval_max_wait_s",
    "teacher_endpoint", "teacher_model", "teacher_tokenizer", "controller_endpoint",
    "controller_model", "api_key_env", "train_where", "dev_where", "sources",
)  # fmt: skip


def eviback_data(config: Mapping[str, Any], out: Path, rows: int) -> dict[str, str]:
    """Write FlashRAG jsonl for every source of ``assets.train`` / ``dev`` / ``eval`` (source
    name -> file mappings; ``rows`` rows each) and, when ``assets.corpus`` is set, the stand-in
    corpus; returns ``{"assets.train.nq": path, ...}``."""
    assets = _assets(config, "eviback", EVIBACK_DATA, EVIBACK_OTHER)
    overrides: dict[str, str] = {}
    for group in ("train", "dev", "eval"):
        for source, configured in _mapping(assets, group, "eviback").items():
            key = f"assets.{group}.{source}"
            try:
                pool = _flashrag_pool(str(source))
            except AssetsError as e:
                raise AssetsError(f"eviback_data: {key}: {e}") from None
            overrides[key] = _write(_target(Path(out), key, configured), cycle_rows(pool, rows))
    if assets.get("corpus"):
        overrides["assets.corpus"] = str(standin_corpus(Path(out)).resolve())
    return overrides


# --- CER -------------------------------------------------------------------------------------

_CER_SAMPLES = {
    "math": "math_train_handmade.jsonl",
    "math500": "math500_handmade.jsonl",
    "amc23": "amc23_handmade.jsonl",
    "aime24": "aime24_handmade.jsonl",
    "aime25": "aime25_handmade.jsonl",
    "mmlu_pro": "mmlu_pro_handmade.jsonl",
    "supergpqa": "supergpqa_handmade.jsonl",
    "webinstruct": "webinstruct_handmade.jsonl",
}
# a file or benchmark name's layout: the first pattern found in it (lower case) wins
_CER_NAMES = (
    ("webinstruct", "webinstruct"), ("mmlu", "mmlu_pro"), ("supergpqa", "supergpqa"),
    ("gpqa", "supergpqa"), ("math500", "math500"), ("math-500", "math500"), ("amc", "amc23"),
    ("aime24", "aime24"), ("aime_2024", "aime24"), ("aime25", "aime25"), ("aime", "aime25"),
    ("math", "math"),
)  # fmt: skip
_CER_FORMATS = {
    "math": "math", "answer": "math500", "webinstruct": "webinstruct", "mmlu_pro": "mmlu_pro",
    "supergpqa": "supergpqa",
}  # fmt: skip
CER_DATA = ("train", "dev", "eval", "warmup")
CER_OTHER = ("model", "init_model", "train_format", "train_filter", "how_to_get", "sources")


def cer_layout(name: str) -> str | None:
    """The stand-in layout (a key of the CER samples) a file or benchmark name points to."""
    lower = name.lower()
    return next((layout for pattern, layout in _CER_NAMES if pattern in lower), None)


def cer_data(config: Mapping[str, Any], out: Path, rows: int) -> dict[str, str]:
    """Write ``assets.train`` (MATH train or WebInstruct-verified as ``train_format`` says, else
    as its file name says), ``dev``, every ``eval`` entry and a set ``warmup`` (MATH
    layout, with solutions) in their hub layouts, ``rows`` rows each (WebInstruct with
    ``train_filter: webinstruct_paper``: ``rows`` rows the filter keeps, then two it drops);
    returns ``{"assets.train": path, "assets.eval.math500": path, ...}``."""
    assets = _assets(config, "cer", CER_DATA, CER_OTHER)
    out = Path(out)

    def layout_of(key: str, *names: str) -> str:
        for name in names:
            layout = cer_layout(name)
            if layout:
                return layout
        shown = " or ".join(repr(n) for n in names)
        raise AssetsError(
            f"cer_data: {key}: cannot tell the data layout from {shown} (known names contain "
            f"one of {sorted({p for p, _ in _CER_NAMES})})"
        )

    fmt = str(assets.get("train_format") or "auto")
    if fmt != "auto" and fmt not in _CER_FORMATS:
        raise AssetsError(
            f"cer_data: assets.train_format {fmt!r} is not one of {sorted(_CER_FORMATS)}"
        )
    wanted: dict[str, tuple[str, Any]] = {}
    if "train" in assets:
        layout = (
            _CER_FORMATS[fmt] if fmt != "auto" else layout_of("assets.train", str(assets["train"]))
        )
        wanted["assets.train"] = (layout, assets["train"])
    if assets.get("warmup"):
        wanted["assets.warmup"] = ("math", assets["warmup"])
    if "dev" in assets:
        wanted["assets.dev"] = (layout_of("assets.dev", str(assets["dev"])), assets["dev"])
    for name, configured in _mapping(assets, "eval", "cer").items():
        key = f"assets.eval.{name}"
        wanted[key] = (layout_of(key, str(name), str(configured)), configured)

    overrides = {}
    for key, (layout, configured) in wanted.items():
        base = _read_rows(f"cer/{_CER_SAMPLES[layout]}")
        if (
            key == "assets.train"
            and layout == "webinstruct"
            and assets.get("train_filter") == ("webinstruct_paper")
        ):
            kept = [r for r in base if _paper_subset(r)]
            made = cycle_rows(kept, rows) + [r for r in base if not _paper_subset(r)]
        else:
            made = cycle_rows(base, rows)
        overrides[key] = _write(_target(out, key, configured), made)
    return overrides


def _paper_subset(row: Row) -> bool:
    return row["category"] != "Mathematics" and row["difficulty"] == "University"


# --- ARCO ------------------------------------------------------------------------------------

ARCO_DATA = ("train", "dev", "eval", "corpus")
ARCO_OTHER = (
    "model", "retrieval_url", "retrieval_max_wait_s", "teacher_endpoint", "teacher_model",
    "annotator_endpoint", "annotator_model", "api_key_env", "train_where", "dev_where",
    "eval_where", "sources",
)  # fmt: skip
_ARCO_NAMES = (("hotpot", "hotpotqa"), ("2wiki", "2wiki"), ("musique", "musique"))


def arco_layout(name: str) -> str | None:
    """hotpotqa, 2wiki or musique: the original layout a file or benchmark name points to."""
    lower = name.lower()
    return next((layout for pattern, layout in _ARCO_NAMES if pattern in lower), None)


def _arco_pool(layout: str) -> list[Row]:
    if layout == "hotpotqa":
        return _hotpotqa_rows()
    if layout == "2wiki":
        return _read_rows("2wiki_handmade.json")
    return _read_rows("musique_handmade.jsonl")


def arco_data(config: Mapping[str, Any], out: Path, rows: int) -> dict[str, str]:
    """Write ``assets.train``, ``dev`` and every ``eval`` entry in the original
    layout their names point to (HotpotQA / 2WikiMultiHopQA: a JSON list of rows with 10-or-so
    context paragraphs and supporting facts; MuSiQue: jsonl with ``paragraphs``), ``rows`` rows
    each, and the stand-in corpus when ``assets.corpus`` is set; returns the overrides."""
    assets = _assets(config, "arco", ARCO_DATA, ARCO_OTHER)
    out = Path(out)
    wanted: dict[str, tuple[tuple[str, ...], Any]] = {}
    for key in ("train", "dev"):
        if assets.get(key):
            wanted[f"assets.{key}"] = ((str(assets[key]),), assets[key])
    for name, configured in _mapping(assets, "eval", "arco").items():
        wanted[f"assets.eval.{name}"] = ((str(name), str(configured)), configured)
    overrides = {}
    for key, (names, configured) in wanted.items():
        layout = next((arco_layout(n) for n in names if arco_layout(n)), None)
        if layout is None:
            raise AssetsError(
                f"arco_data: {key}: cannot tell the data layout from "
                f"{' or '.join(map(repr, names))} (a name containing hotpot, 2wiki or musique)"
            )
        overrides[key] = _write(_target(out, key, configured), cycle_rows(_arco_pool(layout), rows))
    if assets.get("corpus"):
        overrides["assets.corpus"] = str(standin_corpus(out).resolve())
    return overrides


# --- config reading --------------------------------------------------------------------------


def _assets(
    config: Mapping[str, Any], family: str, data: tuple[str, ...], other: tuple[str, ...]
) -> Mapping[str, Any]:
    """``config["assets"]``, checked: every key is a data key or a known other key."""
    if "defaults" in config:
        raise AssetsError(
            f"{family}_data: the config still names defaults: {config['defaults']!r}; pass the "
            "loaded config with its defaults chain merged"
        )
    assets = config.get("assets")
    if not isinstance(assets, Mapping):
        raise AssetsError(f"{family}_data: the config has no 'assets' mapping")
    unknown = sorted(str(k) for k in assets if k not in data and k not in other)
    if unknown:
        raise AssetsError(
            f"{family}_data: assets.{unknown[0]} is not a key the stand-in data knows "
            f"(data keys: {', '.join(data)}; other keys: {', '.join(other)})"
        )
    return assets


def _mapping(assets: Mapping[str, Any], key: str, family: str) -> Mapping[str, Any]:
    value = assets.get(key) or {}
    if not isinstance(value, Mapping):
        raise AssetsError(f"{family}_data: assets.{key} must map names to files, got {value!r}")
    return value


# --- corpus and encoder ----------------------------------------------------------------------


def corpus_docs() -> list[tuple[str, str, str]]:
    """(id, title, text) of the stand-in corpus: the wiki18 sample, the hand-made open-domain
    documents, and every paragraph of the stand-in HotpotQA, 2Wiki and MuSiQue rows (answers as
    rewritten), each (title, text) once."""
    docs: list[tuple[str, str, str]] = []
    seen: set[tuple[str, str]] = set()

    def add(prefix: str, title: str, text: str) -> None:
        if (title, text) not in seen:
            seen.add((title, text))
            docs.append((f"{prefix}-{len(docs)}", title, text))

    for name, prefix in (("wiki18_sample_corpus.jsonl", "wiki18"), ("handmade_corpus.jsonl", "hm")):
        for row in _read_rows(name):
            title, _, text = row["contents"].partition("\n")
            add(prefix, title.strip('"'), text)
    for row in _hotpotqa_rows():
        for title, sentences in row["context"]:
            add("hotpotqa", title, " ".join(s.strip() for s in sentences))
    for row in _read_rows("2wiki_handmade.json"):
        for title, sentences in row["context"]:
            add("2wiki", title, " ".join(s.strip() for s in sentences))
    for row in _read_rows("musique_handmade.jsonl"):
        for p in row["paragraphs"]:
            add("musique", p["title"], p["paragraph_text"])
    return docs


def standin_corpus(out: Path) -> Path:
    """Write the stand-in corpus (``corpus_docs``) in Search-R1's format, ``{"id", "contents":
    "\\"Title\\"\\ntext"}`` a line, to ``out/corpus.jsonl``; returns its path."""
    path = Path(out) / "corpus.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"id": i, "contents": f'"{title}"\n{text}'}, ensure_ascii=False) + "\n"
        for i, title, text in corpus_docs()
    ]
    path.write_text("".join(lines), encoding="utf-8")
    return path


E5_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def standin_e5_encoder(out: Path, layers: int = 2, hidden: int = 32, seed: int = 0) -> Path:
    """A random ``BertModel`` (E5-base-v2's architecture class; ``layers`` layers, ``hidden``
    wide) with a lower-casing WordPiece tokenizer trained here, offline, on the stand-in corpus's
    words and E5's "query: " / "passage: " prefixes: the vocabulary is not E5's. Saved with
    ``save_pretrained`` to ``out/e5``, the folder ``common.retrieval.dense.Encoder`` (mean
    pooling) and ``python -m common.retrieval index --dense-encoder`` read; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers.processors import TemplateProcessing
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(out) / "e5"
    texts = [f"query: passage: {title} {text}" for _, title, text in corpus_docs()]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=4000, special_tokens=E5_SPECIAL)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.decoder = decoders.WordPiece()
    tokenizer = BertTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 16),
        intermediate_size=2 * hidden,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# --- a stand-in hub --------------------------------------------------------------------------


def standin_hub(
    sources: Mapping[str, str], files: Mapping[str, str], hub: Path, models: Mapping[str, Path]
) -> None:
    """Lay stand-in files out in ``hub`` as ``experiments.prepare_data.FolderHub`` reads a hub:
    at each source of ``sources`` (``assets.sources``: key -> source) the stand-in file of that
    key (``files``: ``"assets.KEY"`` -> path, as the writers above return them); a sampled source
    (``#sample=N&seed=S``) gets the file's rows cycled to N + 3 (``cycle_rows``, each id then
    suffixed with its row number: the stand-in's rows may be copies already), a split its rows
    as jsonl; each model id of ``models`` a folder with its stand-in's ``config.json``."""
    from experiments.prepare_data import SAMPLE, FolderHub

    places = FolderHub(hub)
    for key, source in sources.items():
        if f"assets.{key}" not in files:
            raise AssetsError(f"standin_hub: assets.sources.{key} names no stand-in file")
        standin = Path(files[f"assets.{key}"])
        text = standin.read_text(encoding="utf-8")
        rows = json.loads(text) if standin.suffix == ".json" else None
        if sampled := SAMPLE.fullmatch(source):
            source = sampled["source"]
            if rows is None:
                rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            rows = _numbered_ids(cycle_rows(rows, int(sampled["n"]) + 3))
        place = places.place(source)
        place.parent.mkdir(parents=True, exist_ok=True)
        if place.suffix == ".jsonl" and rows is not None:
            place.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        elif rows is not None:
            place.write_text(json.dumps(rows, ensure_ascii=False))
        else:
            place.write_text(text, encoding="utf-8")
    for model_id, folder in models.items():
        (hub / model_id).mkdir(parents=True, exist_ok=True)
        (hub / model_id / "config.json").write_text((Path(folder) / "config.json").read_text())


def _numbered_ids(rows: list[Row]) -> list[Row]:
    """``rows`` with each id made unique by its position (an integer id: the position)."""
    for i, row in enumerate(rows):
        key = next((key for key in _ID_KEYS if key in row), None)
        if key is not None:
            row[key] = i if isinstance(row[key], int) else f"{row[key]}-{i}"
    return rows
