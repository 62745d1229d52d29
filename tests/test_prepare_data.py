"""``make data`` (experiments/prepare_data.py) on a local stand-in for the hub, in its layout, with
the shared sample formats: every file a paper config names, once, loadable; a second run fetches
nothing; a half-done copy resumes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import ConfigError, load_config
from common.data import load_qa
from eviback.config import EviBackConfig
from experiments.prepare_data import (
    FetchError,
    FolderHub,
    copy_resuming,
    plan,
    prepare,
    whole_file,
    write_sample,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
EVIBACK = ROOT / "eviback/configs/qwen3_0.6b.yaml"
CER = ROOT / "cer/configs/qwen3_4b_base_math.yaml"
FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"


@pytest.fixture
def hub(tmp_path) -> Path:
    """The stand-in: FlashRAG's files (the hand-made FlashRAG rows), CER's splits (the hand-made
    MATH rows as jsonl) and the two models' folders."""
    root = tmp_path / "hub"
    cfg = load_config(EviBackConfig, str(EVIBACK))
    for source in cfg.assets.sources.values():
        path = root / FLASHRAG / source.removeprefix(f"hf-file://{FLASHRAG}/")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / "qa" / "flashrag_handmade.jsonl", path)
    math500 = json.loads((DATA / "cer" / "math500_handmade.json").read_text())
    for repo, split in [("DigitalLearningGmbH/MATH-lighteval", "train"),
                        ("math-ai/math500", "test"), ("math-ai/amc23", "test"),
                        ("math-ai/aime24", "test"), ("math-ai/aime25", "test"),
                        ("TIGER-Lab/MMLU-Pro", "test"), ("m-a-p/SuperGPQA", "train")]:  # fmt: skip
        path = root / repo / "default" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in math500))
    for model in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B-Base"):
        (root / model).mkdir(parents=True)
        (root / model / "config.json").write_text("{}")
    return root


def test_eviback_gets_exactly_flashrags_files_it_reads_then_nothing_again(hub, tmp_path, capsys):
    out = tmp_path / "project"
    assert prepare(EVIBACK, FolderHub(hub), root=out) == 0
    said = capsys.readouterr().out
    assert "0 file(s) already there, 12 to fetch" in said  # 13 keys, hotpotqa's dev twice
    assert f"model Qwen/Qwen3-0.6B: {hub / 'Qwen/Qwen3-0.6B'}" in said
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert len(written) == 12 and not any(p.endswith(".part") for p in written)
    assert "data/flashrag/2wikimultihopqa/train.jsonl" in written
    assert "data/flashrag/hotpotqa/dev.jsonl" in written  # dev.hotpotqa and eval.hotpotqa
    rows = load_qa(out / "data/flashrag/bamboogle/test.jsonl")
    assert len(rows) == 3 and rows[0].golden_answers  # FlashRAG rows load as the run loads them
    assert prepare(EVIBACK, FolderHub(hub), root=out) == 0
    assert "12 file(s) already there, 0 to fetch" in capsys.readouterr().out


def test_cer_writes_each_split_as_jsonl_once(hub, tmp_path, capsys):
    out = tmp_path / "project"
    assert prepare(CER, FolderHub(hub), root=out) == 0
    said = capsys.readouterr().out
    assert "data/cer/math500.jsonl  <- hf://math-ai/math500@test" in said
    assert "; dev, eval.math500)" in said  # one file, two keys
    expected = json.loads((DATA / "cer" / "math500_handmade.json").read_text())
    for name in ("math_train", "math500", "amc23", "aime24", "aime25", "mmlu_pro", "supergpqa"):
        lines = (out / "data" / "cer" / f"{name}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == expected, name


def test_a_half_done_copy_resumes_after_its_bytes(hub, tmp_path):
    src = hub / FLASHRAG / "nq" / "train.jsonl"
    data = src.read_bytes()
    part = tmp_path / "train.jsonl.part"
    part.write_bytes(b"X" * 10)  # what a cut-off copy left: its bytes are kept, the rest follows
    copy_resuming(src, part)
    assert part.read_bytes() == b"X" * 10 + data[10:]
    part.write_bytes(data + b"more")  # longer than the source: started again
    copy_resuming(src, part)
    assert part.read_bytes() == data
    # through make data: a .part of the first half becomes the whole file
    out = tmp_path / "project"
    target = out / "data/flashrag/nq/train.jsonl"
    target.parent.mkdir(parents=True)
    (target.parent / "train.jsonl.part").write_bytes(data[: len(data) // 2])
    assert prepare(EVIBACK, FolderHub(hub), root=out) == 0
    assert target.read_bytes() == data and not (target.parent / "train.jsonl.part").exists()


def test_plan_lists_keys_without_a_source_and_refuses_bad_sources(tmp_path):
    cfg = load_config(EviBackConfig, str(EVIBACK))
    cfg.assets.sources.pop("eval.popqa")
    fetches, unsourced, present = plan(cfg.assets, tmp_path)
    assert unsourced == ["eval.popqa"] and present == {} and len(fetches) == 11
    cfg.assets.sources["eval.popqa"] = "ftp://example.org/popqa.jsonl"
    with pytest.raises(ConfigError, match=r"^assets.sources.eval.popqa: 'ftp://example.org"):
        plan(cfg.assets, tmp_path)
    cfg.assets.sources["eval.popqa"] = "hf-file://RUC-NLPIR/FlashRAG_datasets/popqa/test.jsonl"
    cfg.assets.sources["eval.hotpotqa"] = "hf://hotpotqa/hotpot_qa:distractor@validation"
    with pytest.raises(ConfigError, match="hotpotqa/dev.jsonl is named by dev.hotpotqa and"):
        plan(cfg.assets, tmp_path)


def test_keys_without_a_source_are_listed_with_how_to_get_them(tmp_path):
    """A paper config whose data keys have no source (ARCO's 2Wiki config with its sources cut):
    the command names the keys and the config's way to get them, exit 1."""
    import yaml

    raw = yaml.safe_load((ROOT / "arco/configs/llama3.2_3b_2wiki.yaml").read_text())
    del raw["assets"]["sources"]
    config = tmp_path / "arco/configs/llama3.2_3b_2wiki.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump(raw))
    run = subprocess.run(
        [sys.executable, "-m", "experiments.prepare_data", "--config", str(config), "--dry-run"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "no source for assets.train" in run.stdout and "how to get them: " in run.stdout
    assert "HotpotQA distractor JSON" in run.stdout


ARCO_RELEASE = (
    "urls/raw.githubusercontent.com/zihangtian/ARCO/5974454e522e8997b92bb9c4e5a656ff23894e72"
)


def test_arco_hotpotqa_gets_the_releases_splits_and_refuses_an_lfs_pointer(tmp_path, capsys):
    """The release's dev split (here its first 3 rows) under the config's file name loads as the
    run loads it; a Git LFS pointer where the train split should be is one error, no file."""
    hub = tmp_path / "hub"
    splits = hub / ARCO_RELEASE / "data/hotpotqa/splits"
    splits.mkdir(parents=True)
    shutil.copy(DATA / "qa" / "hotpotqa_sample.jsonl", splits / "dev.jsonl")
    (splits / "train.jsonl").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:ab12\nsize 123\n"
    )
    (hub / "Qwen/Qwen3-4B-Instruct-2507").mkdir(parents=True)
    (hub / "Qwen/Qwen3-4B-Instruct-2507/config.json").write_text("{}")
    out = tmp_path / "project"
    config = ROOT / "arco/configs/qwen3_4b_hotpotqa.yaml"
    with pytest.raises(FetchError, match="train.jsonl is a Git LFS pointer, not the file"):
        prepare(config, FolderHub(hub), root=out)
    assert not list((out / "data/hotpotqa").glob("*"))
    shutil.copy(DATA / "qa" / "hotpotqa_sample.jsonl", splits / "train.jsonl")
    assert prepare(config, FolderHub(hub), root=out) == 0
    dev = load_qa(out / "data/hotpotqa/hotpot_dev_hard_500.json")
    assert [q.golden_answers for q in dev] == [
        [json.loads(line)["answer"]] for line in (DATA / "qa/hotpotqa_sample.jsonl").open()
    ]


def test_a_model_missing_from_the_hub_is_one_error_line(hub, tmp_path):
    shutil.rmtree(hub / "Qwen/Qwen3-0.6B")
    command = [sys.executable, "-m", "experiments.prepare_data", "--config", str(EVIBACK)]
    run = subprocess.run([*command, "--hub", str(hub)], cwd=tmp_path, capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode == 2
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith("error: Qwen/Qwen3-0.6B: not in the stand-in hub")
    )


PAPER_CONFIGS = sorted(
    str(p.relative_to(ROOT))
    for family in ("cer", "eviback", "arco")
    for p in (ROOT / family / "configs").glob("*.yaml")
    if p.name.startswith(("qwen3_", "llama3.2_"))
)


def standin_hub(config: str, hub: Path, work: Path) -> dict[str, str]:
    """A stand-in hub holding, at each of ``config``'s sources, the rehearsal's stand-in file
    for that key (experiments/rehearse/assets.py: the data sets' own layouts; a sampled source
    N + 3 rows of it); returns the sources by key."""
    from common.config import config_to_dict
    from experiments.prepare_data import config_class
    from experiments.rehearse import assets as rehearsal_data

    cfg = load_config(config_class(ROOT / config), str(ROOT / config))
    family = config.split("/")[0]
    write = {"cer": rehearsal_data.cer_data, "eviback": rehearsal_data.eviback_data,
             "arco": rehearsal_data.arco_data}[family]  # fmt: skip
    written = write(config_to_dict(cfg), work, 4)
    models = {m: work for m in (cfg.assets.model, getattr(cfg.assets, "init_model", "")) if m}
    (work / "config.json").write_text("{}")
    rehearsal_data.standin_hub(cfg.assets.sources, written, hub, models)
    return dict(cfg.assets.sources)


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_every_paper_configs_data_is_made_and_loads_as_its_run_loads_it(config, tmp_path):
    """The 13 paper configs: `make data` on a stand-in hub holding the data sets' own layouts
    writes every file the config names, and the method's loader reads each; ARCO's 2Wiki and
    MuSiQue files hold the rows their seeded rule draws."""
    from experiments.prepare_data import SAMPLE, config_class, data_keys

    sources = standin_hub(config, tmp_path / "hub", tmp_path / "standin")
    out = tmp_path / "project"
    code = prepare(ROOT / config, FolderHub(tmp_path / "hub"), root=out)
    cfg = load_config(config_class(ROOT / config), str(ROOT / config))
    keys = data_keys(cfg.assets)
    assert code == 0 and set(keys) <= set(sources)
    for key, source in sources.items():
        if m := SAMPLE.fullmatch(source):
            assert len(load_qa(out / keys[key])) == int(m["n"]), key
    for key, path in keys.items():
        if config.startswith("cer/"):
            from cer.data import load_math_examples

            fmt = cfg.assets.train_format if key == "train" else "auto"
            loaded = load_math_examples(out / path, format=fmt or "auto")
            assert loaded.examples, (key, path)
        else:
            assert load_qa(out / path), (key, path)


def test_a_seeded_sample_is_the_same_rows_in_file_order_and_never_more_than_the_file(tmp_path):
    whole = tmp_path / "whole.jsonl"
    whole.write_text("".join(json.dumps({"id": i, "question": f"q{i}"}) + "\n" for i in range(50)))
    first, again, other = (tmp_path / n for n in ("a.jsonl.part", "b.jsonl.part", "c.json.part"))
    assert write_sample(whole, first, 10, 42, "src") == 50
    write_sample(whole, again, 10, 42, "src")
    write_sample(whole, other, 10, 7, "src")
    ids = [json.loads(line)["id"] for line in first.read_text().splitlines()]
    assert first.read_text() == again.read_text()  # the seed fixes the rows
    assert len(set(ids)) == 10 and ids == sorted(ids) and set(ids) <= set(range(50))
    assert ids == sorted(__import__("random").Random(42).sample(range(50), 10))
    assert [r["id"] for r in json.loads(other.read_text())] != ids  # a .json file: a JSON list
    with pytest.raises(FetchError, match="asks for 51 rows, the file .* has 50"):
        write_sample(whole, tmp_path / "d.part", 51, 42, "src")


def test_a_sampled_source_keeps_its_whole_file_and_a_second_sample_fetches_nothing(tmp_path):
    """ARCO's MuSiQue config: the whole train and dev files land under data/.sources/ and the
    2,000 / 500 rows are drawn from them; with the source files gone from the hub, a rerun of a
    deleted sample draws the same rows from the kept whole file."""
    config = "arco/configs/qwen3_4b_musique.yaml"
    sources = standin_hub(config, tmp_path / "hub", tmp_path / "standin")
    out = tmp_path / "project"
    assert prepare(ROOT / config, FolderHub(tmp_path / "hub"), root=out) == 0
    train = out / "data/musique/musique_ans_train_2000.jsonl"
    drawn = train.read_text()
    whole = whole_file(sources["train"].split("#")[0], out)
    assert whole == out / "data/.sources/dgslibisey/MuSiQue/musique_ans_v1.0_train.jsonl"
    assert len(whole.read_text().splitlines()) == 2003 and len(drawn.splitlines()) == 2000
    shutil.rmtree(tmp_path / "hub/dgslibisey")
    train.unlink()
    assert prepare(ROOT / config, FolderHub(tmp_path / "hub"), root=out) == 0
    assert train.read_text() == drawn


def test_a_source_with_a_bad_sample_suffix_is_a_config_error(tmp_path):
    cfg = load_config(EviBackConfig, str(EVIBACK))
    for bad in ("#sample=0&seed=1", "#sample=5", "#seed=1&sample=5"):
        cfg.assets.sources["eval.popqa"] = (
            f"hf-file://RUC-NLPIR/FlashRAG_datasets/popqa/t.jsonl{bad}"
        )
        with pytest.raises(ConfigError, match="optional #sample=N&seed=S"):
            plan(cfg.assets, tmp_path)
