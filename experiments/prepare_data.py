"""``make data``: fetch and build exactly the files a paper config's ``assets`` name.

    python -m experiments.prepare_data --config eviback/configs/qwen3_1.7b.yaml [--hub DIR] [--dry-run]
    make data METHOD=eviback SCALE=1.7b          # METHOD=cer|eviback|arco, SCALE and DATA as for train-*
    make data METHOD=eviback SCALE=1.7b DRY_RUN=1   # --dry-run: the plan, nothing fetched

Each data file an ``assets`` key names (``train``, ``dev``, ``eval.NAME``, and per source
``train.NAME`` / ``dev.NAME`` where the key holds several) comes from the config's
``assets.sources`` under the same key:

* ``hf://owner/name[:config]@split``: that split of a hub dataset (``datasets``), written as
  jsonl, one row a line;
* ``hf-file://owner/name/path/in/repo``: that file of a hub dataset repository, as it is;
* ``https://...``: that file, as it is (ARCO's HotpotQA splits from its release's repository,
  pinned to a commit);
* any of these followed by ``#sample=N&seed=S``: N rows of that file drawn without replacement
  (``random.Random(S).sample`` over the row indices, kept in the file's order) and written as a
  JSON list (a ``.json`` file) or jsonl. The whole file is kept under ``data/.sources/`` so a
  second sample (or a rerun) fetches nothing. ARCO's 2WikiMultiHopQA and MuSiQue configs draw
  their 2,000 training and 500 dev questions this way: the release ships no split of them.

The models (``assets.model``, CER's ``assets.init_model``) go into the Hugging Face cache
(``huggingface_hub.snapshot_download``; a gated model, Llama-3.2's, needs its licence accepted on
its hub page and ``hf auth login`` first). The plan is printed before anything is fetched: each
file, its source and size where the hub says, the total and the free disk. It is idempotent (a
file already there is kept) and resumable: a file is written as ``<file>.part`` and renamed
when whole; a file from a repository resumes a ``.part`` from its size, and the hub client
resumes its own downloads. Data keys without a source are listed with the config's way to get
them (exit code 1 after the rest is fetched).

``--search-r1-index DIR`` (``make data-index INDEX=DIR``) makes Search-R1's E5 index of
Wikipedia-2018 as its download script leaves it, for ``common.retrieval serve --index DIR``:
``e5_Flat.index`` joined from the two parts of the hub dataset ``PeterJinGo/wiki-18-e5-index``
and ``wiki-18.jsonl`` unzipped from ``PeterJinGo/wiki-18-corpus`` (the index: 21M vectors of 768
float32, about 65 GB), and e5-base-v2, the query encoder ``serve`` loads, into the Hugging Face
cache. Parts already in DIR as Search-R1's ``download.py`` leaves them (``part_aa``, ``part_ab``,
``wiki-18.jsonl.gz``) are joined and unzipped where they are, not fetched again. Each part is
kept until the file it makes is whole, so the disk holds both for a while; the sizes the hub
reports are printed first.

``--hub DIR`` reads a local stand-in for the hub instead, in the same layout: a repository's file
at ``DIR/owner/name/path``, a split at ``DIR/owner/name/<config or default>/<split>.jsonl``, a
URL's file at ``DIR/urls/<host>/<path>``, a model at ``DIR/owner/name/`` (checked, not copied). The tests use it; nothing else here is
offline-tested (the remote path runs ``huggingface_hub`` and ``datasets``, which need the hub).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from common.config import ConfigError, load_config, module_parser
from common.model_id import in_hub_cache
from common.retrieval.search_r1_index import E5
from common.train.memory_plan import MemoryPlanError, config_class

ROOT = Path(__file__).resolve().parents[1]
HF_SPLIT = re.compile(r"hf://(?P<repo>[^/:@]+/[^/:@]+)(?::(?P<config>[^@]+))?@(?P<split>[^#]+)")
HF_FILE = re.compile(r"hf-file://(?P<repo>[^/]+/[^/]+)/(?P<path>[^#]+)")
URL = re.compile(r"https://(?P<host>[^/\s#]+)/(?P<path>[^\s#]+)")
SAMPLE = re.compile(r"(?P<source>.+)#sample=(?P<n>[1-9][0-9]*)&seed=(?P<seed>[0-9]+)")
_COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Fetch:
    """One file to make: where it goes, where it comes from, the asset keys that name it."""

    target: Path
    source: str
    keys: tuple[str, ...]

    @property
    def sample(self) -> tuple[str, int, int] | None:
        """(the whole file's source, rows, seed) when the file is a seeded sample of another."""
        m = SAMPLE.fullmatch(self.source)
        return (m["source"], int(m["n"]), int(m["seed"])) if m else None


def hub_path(source: str) -> Path:
    """A source's place in the hub's layout (the module's docstring): ``owner/name/path``,
    ``owner/name/<config or default>/<split>.jsonl``, ``urls/<host>/<path>``."""
    if m := HF_FILE.fullmatch(source):
        return Path(m["repo"]) / m["path"]
    if m := URL.fullmatch(source):
        return Path("urls") / m["host"] / m["path"]
    m = HF_SPLIT.fullmatch(source)
    assert m is not None
    return Path(m["repo"]) / (m["config"] or "default") / f"{m['split']}.jsonl"


def whole_file(source: str, root: Path = ROOT) -> Path:
    """Where the whole file a sample is drawn from is kept: ``data/.sources/`` and the source's
    place in the hub's layout (``hub_path``)."""
    return root / "data" / ".sources" / hub_path(source)


def write_sample(whole: Path, part: Path, n: int, seed: int, source: str) -> int:
    """Write ``n`` rows of ``whole`` (jsonl or a JSON list) drawn with ``seed`` into ``part``:
    a JSON list when the file it becomes ends in ``.json``, jsonl otherwise; returns the rows
    the whole file has. Fewer rows than ``n`` is a ``FetchError`` naming both."""
    import random

    from common.data import read_json_rows

    rows = [row for _, row in read_json_rows(whole)]
    if n > len(rows):
        raise FetchError(f"{source}: asks for {n} rows, the file ({whole}) has {len(rows)}")
    chosen = [rows[i] for i in sorted(random.Random(seed).sample(range(len(rows)), n))]
    with part.open("w", encoding="utf-8") as f:
        if part.name.removesuffix(".part").endswith(".json"):
            json.dump(chosen, f, ensure_ascii=False)
        else:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in chosen)
    return len(rows)


def data_keys(assets: Any) -> dict[str, str]:
    """The data files ``assets`` names, by key: ``train``, ``dev`` (or ``train.NAME`` /
    ``dev.NAME`` where they map sources to files) and ``eval.NAME``; hub paths (``hf://``, loaded
    at run time) and empty values left out."""
    out: dict[str, str] = {}
    for key in ("train", "dev", "eval"):
        value = getattr(assets, key, None)
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for name, path in items:
            if isinstance(path, str) and path and not path.startswith("hf://"):
                out[key if name is None else f"{key}.{name}"] = path
    return out


def plan(assets: Any, root: Path = ROOT) -> tuple[list[Fetch], list[str], dict[str, str]]:
    """(files to fetch, keys with no source, keys already there -> path) for ``assets``: a file
    named by several keys is fetched once; a source must be one of the two forms."""
    sources: Mapping[str, str] = getattr(assets, "sources", {}) or {}
    for key, source in sources.items():
        m = SAMPLE.fullmatch(source)
        whole = m["source"] if m else source
        if not any(form.fullmatch(whole) for form in (HF_SPLIT, HF_FILE, URL)):
            raise ConfigError(
                f"assets.sources.{key}: {source!r} is none of hf://owner/name[:config]@split, "
                "hf-file://owner/name/path and https://..., each with an optional "
                "#sample=N&seed=S"
            )
    by_target: dict[Path, tuple[str, list[str]]] = {}
    unsourced, present = [], {}
    for key, path in data_keys(assets).items():
        target = Path(path) if Path(path).is_absolute() else root / path
        if target.is_file():
            present[key] = path
            continue
        source = sources.get(key)
        if source is None:
            unsourced.append(key)
            continue
        if target in by_target and by_target[target][0] != source:
            raise ConfigError(
                f"assets.sources: {path} is named by {by_target[target][1][0]} and {key} with "
                f"two sources ({by_target[target][0]}, {source})"
            )
        by_target.setdefault(target, (source, []))[1].append(key)
    fetches = [Fetch(t, s, tuple(keys)) for t, (s, keys) in by_target.items()]
    return fetches, unsourced, present


class FolderHub:
    """A local stand-in for the hub, in its layout (see the module's docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def place(self, source: str) -> Path:
        """Where ``source`` sits in the stand-in hub."""
        return self.root / hub_path(source)

    def size(self, source: str) -> int | None:
        path = self.place(source)
        return path.stat().st_size if path.is_file() else None

    def fetch(self, source: str, part: Path) -> None:
        src = self.place(source)
        if not src.is_file():
            raise FileNotFoundError(f"{source}: not in the stand-in hub ({src})")
        if HF_FILE.fullmatch(source) or URL.fullmatch(source):
            copy_resuming(src, part)
        else:  # a split: its rows, rewritten whole
            write_rows(
                (json.loads(line) for line in src.open(encoding="utf-8") if line.strip()), part
            )

    def model(self, repo: str) -> str:
        folder = self.root / repo
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{repo}: not in the stand-in hub ({folder}/config.json)")
        return str(folder)


class RemoteHub:
    """The Hugging Face hub (``huggingface_hub``, ``datasets``); never run offline here."""

    def size(self, source: str) -> int | None:
        if URL.fullmatch(source):
            import httpx

            try:
                head = httpx.head(source, follow_redirects=True, timeout=30)
                return int(head.headers["content-length"])
            except (httpx.HTTPError, KeyError, ValueError):
                return None
        m = HF_FILE.fullmatch(source)
        if m is None:
            return None  # a split's size is the rows', known once they are written
        from huggingface_hub import HfApi

        try:
            (info,) = HfApi().get_paths_info(m["repo"], [m["path"]], repo_type="dataset")
        except Exception:  # noqa: BLE001 (the size is only shown)
            return None
        return getattr(info, "size", None)

    def fetch(self, source: str, part: Path) -> None:
        if m := HF_FILE.fullmatch(source):
            from huggingface_hub import hf_hub_download

            cached = hf_hub_download(m["repo"], m["path"], repo_type="dataset")  # resumes itself
            copy_resuming(Path(cached), part)
            return
        if URL.fullmatch(source):
            download_resuming(source, part)
            return
        m = HF_SPLIT.fullmatch(source)
        assert m is not None
        import datasets

        rows = datasets.load_dataset(m["repo"], m["config"], split=m["split"])
        write_rows(iter(rows), part)

    def model(self, repo: str) -> str:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError

        try:
            return snapshot_download(repo)
        except GatedRepoError:
            raise ConfigError(
                f"{repo} is gated: accept its licence on https://huggingface.co/{repo} with "
                "your account, then `hf auth login` on this machine, and run again"
            ) from None


class FetchError(RuntimeError):
    """A file could not be fetched; its ``.part`` stays for the next run."""


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"


def check_not_a_pointer(part: Path, source: str) -> None:
    """A Git LFS pointer instead of the file (a repository's large file fetched by its plain
    URL) is an error that says so; the ``.part`` is removed."""
    with part.open("rb") as f:
        head = f.read(len(LFS_POINTER))
    if head == LFS_POINTER:
        part.unlink()
        raise FetchError(
            f"{source} is a Git LFS pointer, not the file: fetch it through the repository's "
            "LFS (for GitHub, https://media.githubusercontent.com/media/<owner>/<repo>/<commit>/"
            "<path>) and give that URL in assets.sources"
        )


def copy_resuming(src: Path, part: Path) -> None:
    """Copy ``src`` into ``part``, continuing after the bytes a ``part`` already holds (a copy
    cut off midway); a ``part`` longer than ``src`` is started again."""
    total = src.stat().st_size
    done = part.stat().st_size if part.is_file() else 0
    if done > total:
        done = 0
    with (
        src.open("rb") as f,
        part.open("r+b" if done else "wb") as out,
        tqdm(
            total=total, initial=done, unit="B", unit_scale=True, desc=part.name[: -len(".part")]
        ) as bar,
    ):
        f.seek(done)
        out.seek(done)
        while chunk := f.read(_COPY_CHUNK):
            out.write(chunk)
            bar.update(len(chunk))
        out.truncate()


def download_resuming(url: str, part: Path) -> None:
    """Download ``url`` into ``part``, asking for the bytes after those ``part`` holds (an HTTP
    Range request); a server that answers with the whole file starts it again."""
    import httpx

    done = part.stat().st_size if part.is_file() else 0
    headers = {"Range": f"bytes={done}-"} if done else {}
    with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as r:
        if r.status_code == 416:  # nothing after `done`: the part is whole
            return
        r.raise_for_status()
        resumed = r.status_code == 206
        total = int(r.headers.get("content-length", 0)) + (done if resumed else 0)
        with (
            part.open("ab" if resumed else "wb") as out,
            tqdm(
                total=total or None,
                initial=done if resumed else 0,
                unit="B",
                unit_scale=True,
                desc=part.name[: -len(".part")],
            ) as bar,
        ):
            for chunk in r.iter_bytes(_COPY_CHUNK):
                out.write(chunk)
                bar.update(len(chunk))


def write_rows(rows: Any, part: Path) -> int:
    """Write ``rows`` (dicts) as jsonl into ``part``; returns how many."""
    n = 0
    with part.open("w", encoding="utf-8") as f:
        for row in tqdm(rows, unit=" rows", desc=part.name[: -len(".part")]):
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            n += 1
    return n


def model_ids(assets: Any) -> list[str]:
    """The hub ids of the models a config's ``assets`` train from (not local folders)."""
    ids = [getattr(assets, k, "") for k in ("model", "init_model")]
    return [m for m in dict.fromkeys(ids) if m and not Path(m).exists() and "/" in m]


def how_to_get(cfg: Any) -> str:
    """The config's own words on getting its data (CER's ``assets.how_to_get``; the package's
    ``HOW_TO_GET["qa"]`` for EviBack and ARCO)."""
    text = getattr(cfg.assets, "how_to_get", "")
    if not text:
        text = getattr(sys.modules[type(cfg).__module__], "HOW_TO_GET", {}).get("qa", "")
    return " ".join(text.split())


def _size(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.1f} MiB"


def prepare(config: str | Path, hub: Any, *, dry_run: bool = False, root: Path = ROOT) -> int:
    """Print the plan for ``config``'s assets, then fetch what is missing. 0 when every data
    file and model is there at the end; 1 when some key has no source; errors raise."""
    cfg = load_config(config_class(config), str(config))
    fetches, unsourced, present = plan(cfg.assets, root)
    models = model_ids(cfg.assets)
    sizes = [hub.size(f.sample[0] if f.sample else f.source) for f in fetches]
    print(
        f"[data] {config}: {len(set(present.values()))} file(s) already there, {len(fetches)} to fetch"
    )
    for f, size in zip(fetches, sizes, strict=True):
        what = f"{_size(size)}" + (f", {f.sample[1]} rows of it kept" if f.sample else "")
        print(
            f"[data]   {f.target.relative_to(root) if f.target.is_relative_to(root) else f.target}"
            f"  <- {f.source}  ({what}; {', '.join(f.keys)})"
        )
    for model in models:
        print(f"[data]   model {model} -> the Hugging Face cache")
    known = sum(s for s in sizes if s is not None)
    free = shutil.disk_usage(_existing_parent(root / "data")).free
    unknown = sum(s is None for s in sizes)
    print(
        f"[data] {_size(known)} of files"
        + (f" + {unknown} of unknown size" if unknown else "")
        + f" + the models; {free / 2**30:,.1f} GiB free"
    )
    for key in unsourced:
        print(f"[data]   no source for assets.{key}")
    if unsourced:
        print(f"[data]   how to get them: {how_to_get(cfg)}")
    if dry_run:
        return 1 if unsourced else 0
    for f in fetches:
        part = f.target.with_name(f.target.name + ".part")
        if f.sample is None:
            fetch_file(hub, f.source, f.target)
        else:
            source, n, seed = f.sample
            whole = whole_file(source, root)
            if not whole.is_file():
                fetch_file(hub, source, whole)
            f.target.parent.mkdir(parents=True, exist_ok=True)
            total = write_sample(whole, part, n, seed, f.source)
            part.replace(f.target)
            print(f"[data] wrote {f.target}: {n} of {total} rows (seed {seed})", flush=True)
    for model in models:
        print(f"[data] model {model}: {hub.model(model)}", flush=True)
    if unsourced:
        print(f"[data] {len(unsourced)} key(s) without a source: see above", file=sys.stderr)
        return 1
    return 0


def fetch_file(hub: Any, source: str, target: Path) -> None:
    """Fetch ``source`` whole into ``target`` through ``<target>.part`` (kept on failure)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    try:
        hub.fetch(source, part)
    except Exception as e:  # the network, the hub, a missing split: name what failed
        raise FetchError(f"{source} -> {part} (kept, resumed next time): {e}") from e
    check_not_a_pointer(part, source)
    part.replace(target)
    print(f"[data] wrote {target}", flush=True)


SEARCH_R1_INDEX: dict[
    str, tuple[str, ...]
] = {  # Search-R1's scripts/download.py, then cat / gzip -d
    "e5_Flat.index": (
        "hf-file://PeterJinGo/wiki-18-e5-index/part_aa",
        "hf-file://PeterJinGo/wiki-18-e5-index/part_ab",
    ),
    "wiki-18.jsonl": ("hf-file://PeterJinGo/wiki-18-corpus/wiki-18.jsonl.gz",),
}


SEARCH_R1_ENCODER = E5  # the query encoder serve loads (Search-R1's e5-base-v2)


def _landed_part(folder: Path, src: str) -> tuple[Path, bool]:
    """Where a part of ``SEARCH_R1_INDEX`` is or goes, and whether it is there: in ``folder``
    itself as Search-R1's ``download.py`` leaves it (``part_aa``, ``wiki-18.jsonl.gz``), or in
    ``folder/.parts/`` as this command fetches it."""
    name = src.rsplit("/", 1)[1]
    for place in (folder / name, folder / ".parts" / name):
        if place.is_file():
            return place, True
    return folder / ".parts" / name, False


def prepare_search_r1_index(folder: str | Path, hub: Any, *, dry_run: bool = False) -> int:
    """Make Search-R1's index folder (``SEARCH_R1_INDEX``) in ``folder``: each file from its
    parts, joined or unzipped into ``<file>.part`` and renamed when whole; a file already there
    is kept. A part already in ``folder`` (Search-R1's ``download.py`` run there) is used as it
    is; a missing one is fetched into ``folder/.parts/`` (resumable); the parts are removed
    once their file is whole. Then the query encoder ``serve`` loads (e5-base-v2) into the
    Hugging Face cache. Prints the plan and the free disk first; returns 0."""
    folder = Path(folder)
    todo = {name: parts for name, parts in SEARCH_R1_INDEX.items() if not (folder / name).is_file()}
    print(
        f"[data] Search-R1's E5 index in {folder}: {len(SEARCH_R1_INDEX) - len(todo)} file(s) "
        f"there, {len(todo)} to make"
    )
    known = 0
    for name, parts in todo.items():
        shown = []
        for src in parts:
            place, landed = _landed_part(folder, src)
            if landed:
                shown.append(f"{place} (there, {_size(place.stat().st_size)})")
            else:
                size = hub.size(src)
                known += size or 0
                shown.append(f"{src} ({_size(size)})")
        print(f"[data]   {name}  <- {', '.join(shown)}")
    print(f"[data]   encoder {SEARCH_R1_ENCODER} -> the Hugging Face cache (serve's query encoder)")
    free = shutil.disk_usage(_existing_parent(folder)).free
    print(
        f"[data] {_size(known)} to fetch, about as much again while a file is joined or "
        f"unzipped; {free / 2**30:,.1f} GiB free"
    )
    if dry_run:
        return 0
    for name, parts in todo.items():
        fetched = []
        for src in parts:
            place, landed = _landed_part(folder, src)
            if not landed:
                fetch_file(hub, src, place)
            fetched.append(place)
        target = folder / name
        part = target.with_name(name + ".part")
        join_parts(fetched, part)
        part.replace(target)
        for f in fetched:
            f.unlink()
        print(f"[data] wrote {target}; removed {', '.join(f.name for f in fetched)}", flush=True)
    shutil.rmtree(folder / ".parts", ignore_errors=True)
    if in_hub_cache(SEARCH_R1_ENCODER):
        print(f"[data] encoder {SEARCH_R1_ENCODER}: already in the Hugging Face cache")
    else:
        print(f"[data] encoder {SEARCH_R1_ENCODER}: {hub.model(SEARCH_R1_ENCODER)}", flush=True)
    return 0


def join_parts(parts: list[Path], out: Path) -> None:
    """``parts`` one after another into ``out`` (``cat``), a ``.gz`` part unzipped (``gzip -d``);
    the progress bar counts the parts' bytes read."""
    import gzip

    total = sum(p.stat().st_size for p in parts)
    with out.open("wb") as f, tqdm(total=total, unit="B", unit_scale=True, desc=out.stem) as bar:
        for p in parts:
            with p.open("rb") as raw:
                src = gzip.GzipFile(fileobj=raw) if p.suffix == ".gz" else raw
                read = 0
                while chunk := src.read(_COPY_CHUNK):
                    f.write(chunk)
                    bar.update(raw.tell() - read)
                    read = raw.tell()


def _existing_parent(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def main(argv: list[str] | None = None) -> int:
    parser = module_parser("experiments.prepare_data", __doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--config", help="a paper config of cer/, eviback/, arco/")
    what.add_argument("--search-r1-index", metavar="DIR", help="make Search-R1's E5 index in DIR")
    parser.add_argument("--hub", help="a local stand-in for the hub, in its layout")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, fetch nothing")
    args = parser.parse_args(argv)
    try:
        hub = FolderHub(args.hub) if args.hub else RemoteHub()
        if args.search_r1_index:
            return prepare_search_r1_index(args.search_r1_index, hub, dry_run=args.dry_run)
        return prepare(args.config, hub, dry_run=args.dry_run)
    except (ConfigError, MemoryPlanError, FileNotFoundError, FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
