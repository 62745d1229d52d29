"""experiments.results: every reported comparison re-derives from the archived per-question
results, and docs/results.md's generated tables are what the archives give."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from experiments.results import find_archives, load_manifest, main, replace_sections

ROOT = Path(__file__).resolve().parents[1]


def _is_demo(folder: Path) -> bool:
    return yaml.safe_load((folder / "archive.yaml").read_text()).get("kind") == "demo"


def _copy_archives(dest: Path) -> list[Path]:
    """The archives, their specs and docs/results.md, copied under ``dest`` (nothing else)."""
    archives = find_archives(ROOT)
    for folder in archives:
        rel = folder.relative_to(ROOT)
        shutil.copytree(folder, dest / rel)
        if _is_demo(folder):
            continue
        spec = load_manifest(folder)["spec"]
        (dest / spec).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / spec, dest / spec)
    (dest / "docs").mkdir()
    shutil.copy2(ROOT / "docs" / "results.md", dest / "docs" / "results.md")
    return [dest / a.relative_to(ROOT) for a in archives]


def test_the_docs_tables_and_reports_are_what_the_archives_give(tmp_path):
    copies = _copy_archives(tmp_path)
    assert copies, "no archived comparison found"
    docs = tmp_path / "docs" / "results.md"
    before = docs.read_text(encoding="utf-8")
    # scramble every generated table and report of the copy: the run must write them back
    scrambled = before
    names = ["demo" if _is_demo(c) else load_manifest(c)["name"] for c in copies]
    for name in ("summary", "detectable", *names):
        scrambled, unplaced = replace_sections(scrambled, {name: "stale\n"})
        assert not unplaced, f"docs/results.md has no section `{name}`"
    docs.write_text(scrambled, encoding="utf-8")
    for c in copies:
        for report in [*c.glob("comparison*.md"), *c.glob("report.md")]:
            report.write_text("stale\n")
    assert main(["--root", str(tmp_path)]) == 0
    assert docs.read_text(encoding="utf-8") == before, (
        "docs/results.md differs from what the archives give: run `make results`"
    )
    for c in copies:
        original = ROOT / c.relative_to(tmp_path)
        reports = [*sorted(c.glob("comparison*.md")), *sorted(c.glob("comparison*.json"))]
        for report in reports + sorted(c.glob("report.md")):
            assert report.read_text() == (original / report.name).read_text(), (
                f"{original / report.name} differs from what its archive gives: run `make results`"
            )
    assert main(["--root", str(tmp_path), "--check"]) == 0


def test_generated_sections_are_replaced_between_their_markers_only():
    text = (
        "intro 0.224\n<!-- results:begin a -->\nold\n<!-- results:end -->\nmiddle\n"
        "<!-- results:begin b -->\nkept\n<!-- results:end -->\n"
    )
    out, unplaced = replace_sections(text, {"a": "new\n", "c": "x\n"})
    assert out == text.replace("old\n", "new\n")
    assert unplaced == ["c"]


def _tiny_archive(root: Path) -> Path:
    """A 2-seed, 4-question archive of one arm against its start, with its spec and docs."""
    folder = root / "pkg" / "results" / "toy"
    for seed in (0, 1):
        run = folder / "arm" / f"s{seed}" / "dev_results"
        run.mkdir(parents=True)
        # step 0: all wrong; step 2: questions 0 and 1 right at both seeds
        (run / "step_00000.jsonl").write_text(
            "".join(f'{{"id": "q{q}", "em": 0.0}}\n' for q in range(4))
        )
        (run / "step_00002.jsonl").write_text(
            "".join(f'{{"id": "q{q}", "em": {float(q < 2)}}}\n' for q in range(4))
        )
    spec = {"out": "runs/toy", "seeds": [0, 1], "metric": "em", "baseline": "start",
            "arms": [{"name": "arm", "command": ["x"]}]}  # fmt: skip
    (root / "pkg" / "toy.yaml").write_text(yaml.safe_dump(spec))
    manifest = {"name": "toy", "title": "A toy", "short": "toy", "spec": "pkg/toy.yaml",
                "metrics": ["em"], "command": "make toy", "commit": "abc1234",
                "paper_effects": [{"what": "a paper", "arm": "arm", "metric": "em",
                                   "effect": 0.5}]}  # fmt: skip
    (folder / "archive.yaml").write_text(yaml.safe_dump(manifest))
    (root / "docs").mkdir()
    (root / "docs" / "results.md").write_text(
        "# R\n<!-- results:begin summary -->\n<!-- results:end -->\n"
        "<!-- results:begin detectable -->\n<!-- results:end -->\n"
        "<!-- results:begin toy -->\n<!-- results:end -->\n"
    )
    return folder


def test_a_tiny_archive_gives_hand_computed_rows(tmp_path, capsys):
    folder = _tiny_archive(tmp_path)
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert "docs/results.md" in capsys.readouterr().err
    assert main(["--root", str(tmp_path)]) == 0
    docs = (tmp_path / "docs" / "results.md").read_text()
    # Δ per question: 1, 1, 0, 0 at both seeds; mean 0.5; seeds agree, so the seed noise is 0
    assert "| arm | em | 0.000 → 0.500 | +0.500 |" in docs
    assert "made by `make toy` at commit `abc1234`; seeds 0, 1; n = 4 dev questions" in docs
    assert "| a paper | toy | em | +0.500 | 0.000 | seed noise of `arm` (2 seeds) | yes |" in docs
    assert (folder / "comparison.md").is_file() and (folder / "comparison.json").is_file()
    assert main(["--root", str(tmp_path), "--check"]) == 0


def test_a_manifest_without_its_keys_is_one_line(tmp_path, capsys):
    folder = _tiny_archive(tmp_path)
    (folder / "archive.yaml").write_text(yaml.safe_dump({"name": "toy"}))
    assert main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "archive.yaml: missing title, short, spec, metrics, command, commit" in err
    assert err.count("\n") == 1


def test_a_section_the_docs_lack_is_an_error(tmp_path, capsys):
    _tiny_archive(tmp_path)
    (tmp_path / "docs" / "results.md").write_text("# R\n")
    assert main(["--root", str(tmp_path)]) == 2
    assert "no `<!-- results:begin NAME -->` section for" in capsys.readouterr().err
