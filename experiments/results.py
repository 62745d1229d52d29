"""Every reported comparison, recomputed from the per-question results kept in the repository.

    python -m experiments.results [--root DIR] [--check]        (make results)

An archived comparison is a folder ``<package>/results/<name>/`` holding each run's per-question
dev results (``<arm>/s<seed>/dev_results/step_N.jsonl``, as ``experiments.compare --archive``
writes them) and an ``archive.yaml`` that says what made it::

    name: cer-smol                       # the docs section's name
    title: CER and rule+CER vs the rule on SmolLM2-135M and real HotpotQA answers, 40 steps
    short: CER vs the rule, SmolLM2-135M      # its name in the summary tables
    spec: cer/configs/compare_smol.yaml  # the comparison spec (arms, seeds, baseline, metric)
    metrics: [contains, correct, f1]     # per-question fields reported; the spec's metric first
    command: make compare-cer SCALE=smol # what ran the comparison
    commit: 6cbae23                      # the commit whose code made the runs
    arms: [search_r1, eviback_lam0.1]    # optional: the spec's arms it holds (default: all)
    paper_effects:                       # optional: published effects this setting should detect
      - {what: "CER over the rule (paper)", arm: cer, metric: contains, effect: 0.011}

For every archive it writes ``comparison.md``/``.json`` (the spec's metric) and
``comparison_<metric>.md``/``.json`` (the others) with ``experiments.compare``'s report, no
training, and replaces in ``docs/results.md`` each generated section, between
``<!-- results:begin NAME -->`` and ``<!-- results:end -->``: one per archive (``NAME`` = its
name), ``summary`` (a row per archive and arm) and ``detectable`` (the papers' effects against
each setting's minimal detectable difference). An archive whose runs hold held-out test results
(``<arm>/s<seed>/test_results/``) also gets ``comparison_test.md``/``.json`` (and
``comparison_<metric>_test.*``) and a second table in its section; one without (an archive from
before) is reported as before, and the command says "no test split archived". ``--check`` writes
nothing and exits 1 naming every file or section that differs from what the archives give.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from experiments.compare import load_spec, markdown, summarize_splits, summary_json, verdict_cells

ARCHIVE_FILE = "archive.yaml"
DOCS = Path("docs/results.md")
KEYS = ("name", "title", "short", "spec", "metrics", "command", "commit")
SECTION = re.compile(r"(<!-- results:begin (\S+) -->\n)(.*?)(<!-- results:end -->)", re.S)


def find_archives(root: Path) -> list[Path]:
    """Every ``<package>/results/**/archive.yaml`` folder under ``root``, sorted by path."""
    return sorted(p.parent for p in root.glob("*/results/**/" + ARCHIVE_FILE))


def load_manifest(folder: Path) -> dict[str, Any]:
    """A folder's ``archive.yaml``, its keys checked (one-line errors naming the file)."""
    path = folder / ARCHIVE_FILE
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with {', '.join(KEYS)}")
    missing = [k for k in KEYS if not data.get(k)]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    if not isinstance(data["metrics"], list) or not all(
        isinstance(m, str) for m in data["metrics"]
    ):
        raise ValueError(f"{path}: `metrics` must be a list of per-question fields")
    for i, e in enumerate(data.get("paper_effects", [])):
        if not {"what", "arm", "metric", "effect"} <= set(e):
            raise ValueError(f"{path}: paper_effects[{i}] needs what, arm, metric and effect")
    return data


def summaries(
    folder: Path, manifest: dict[str, Any], root: Path
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``experiments.compare.summarize_splits`` of the archive for each of its metrics: the dev
    summaries and the held-out test ones (none when no test split is archived), by metric."""
    spec = {**load_spec(root / manifest["spec"]), "out": str(folder)}
    if manifest.get("arms"):  # an archive of some of the spec's arms (``compare --arms``)
        spec["arms"] = [a for a in spec["arms"] if a["name"] in manifest["arms"]]
    first = spec.get("metric", "em")
    dev, test = {}, {}
    for m in manifest["metrics"]:
        suffix = "" if m == first else f"_{m}"
        dev[m], t = summarize_splits({**spec, "metric": m}, suffix)
        if t:
            test[m] = t
    return dev, test


def report_files(manifest: dict[str, Any], by_metric: dict[str, dict], root: Path) -> list[str]:
    """The report names per metric: ``comparison.md`` for the spec's metric, else
    ``comparison_<metric>.md`` (as ``experiments.compare --metric`` names them)."""
    first = load_spec(root / manifest["spec"]).get("metric", "em")
    return ["" if m == first else f"_{m}" for m in by_metric]


def _against(summary: dict[str, Any]) -> str:
    base = summary["baseline"]
    return "each arm's own step 0" if base == "start" else f"`{base}`"


def _questions(by_metric: dict[str, dict]) -> str:
    ns = sorted({c["n"] for s in by_metric.values() for c in s["comparisons"].values()})
    return " / ".join(map(str, ns))


def archive_section(
    folder: Path, manifest: dict[str, Any], by_metric: dict, root: Path, test: dict | None = None
) -> str:
    """The docs section of one archive: where it came from, then a row per arm and metric with
    the mean start → final, Δ and both intervals with their MDEs and the verdict; the same
    table of the held-out test split below it when one is archived (``test``, by metric)."""
    first = next(iter(by_metric.values()))
    seeds = ", ".join(str(s) for s in first["seeds"])
    lines = [
        f"{manifest['title']}. Archive `{folder.relative_to(root).as_posix()}`, made by "
        f"`{manifest['command']}` at commit `{manifest['commit']}`; seeds {seeds}; "
        f"n = {_questions(by_metric)} dev questions; Δ against {_against(first)}, pooled "
        "over seeds.",
        "",
        *_arm_rows(by_metric),
    ]
    if test:
        lines += [
            "",
            f"Held-out test split (each run's final policy and its step 0; n = "
            f"{_questions(test)} test questions, no setting chosen on them):",
            "",
            *_arm_rows(test),
        ]
    return "\n".join(lines) + "\n"


def _arm_rows(by_metric: dict[str, dict]) -> list[str]:
    """The table of an archive section: a row per metric and arm."""
    lines = [
        "| arm | metric | step 0 → final (mean over seeds) | Δ | 95% CI, questions (seeds fixed)"
        " | MDE | 95% CI, seeds + questions | MDE | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for metric, s in by_metric.items():
        for name, a in s["arms"].items():
            c = s["comparisons"].get(name)
            if not a["seeds_present"]:
                continue
            why = "(baseline)" if name == s["baseline"] else "– (not compared)"
            cells = f"{c['delta']:+.3f} | {verdict_cells(c)}" if c else f"{why} | | | | |"
            lines.append(f"| {name} | {metric} | {a['start']:.3f} → {a['final']:.3f} | {cells} |")
    return lines


def _verdict_interval(c: dict[str, Any]) -> dict[str, float]:
    return c["seeds_and_questions"] if c["verdict"]["interval"] == "seeds_and_questions" else c


def summary_section(archives: list[tuple[Path, dict, dict]], root: Path) -> str:
    """A row per archive and compared arm: each metric's Δ with the interval its verdict uses
    (bold when clear of 0) and that interval's MDE."""
    lines = [
        "| comparison | command | arm − reference: Δ [95% CI, seeds + questions] | MDE | archive |",
        "|---|---|---|---|---|",
    ]
    for folder, manifest, by_metric in archives:
        first = next(iter(by_metric.values()))
        for name in first["comparisons"]:
            cells, mdes = [], []
            for metric, s in by_metric.items():
                c = s["comparisons"][name]
                v = _verdict_interval(c)
                text = f"{c['delta']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]"
                cells.append(f"{metric} " + (f"**{text}**" if c["verdict"]["sign"] else text))
                mdes.append(f"{v['mde']:.3f}")
            rel = folder.relative_to(root).as_posix()
            lines.append(
                f"| {manifest['short']}: `{name}` vs {_against(first)} | `{manifest['command']}` | "
                f"{'; '.join(cells)} | {' / '.join(mdes)} | [{rel}](../{rel}/comparison.md) |"
            )
    return "\n".join(lines) + "\n"


def _times(ratio: float) -> str:
    """A ratio as ``19x``, or ``1.2x`` under 10."""
    return f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x"


def detectable_section(archives: list[tuple[Path, dict, dict]]) -> str:
    """The papers' effects (each archive's ``paper_effects``) against the setting's MDE: the
    comparison's own (seeds + questions) when its reference is another arm, the arm's seed noise
    (two arms that differ only by seed) when its reference is its own start."""
    lines = [
        "| paper's effect | setting | metric | effect | MDE here | which MDE | detectable |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, manifest, by_metric in archives:
        for e in manifest.get("paper_effects", []):
            s = by_metric[e["metric"]]
            if s["baseline"] == "start":
                noise = s["arms"][e["arm"]]["seed_noise"]
                mde, which = noise["mde"], f"seed noise of `{e['arm']}` ({noise['seeds']} seeds)"
            else:
                c = s["comparisons"][e["arm"]]
                mde = _verdict_interval(c)["mde"]
                which = f"`{e['arm']}` vs `{s['baseline']}`, seeds + questions"
            yes = (
                "yes"
                if e["effect"] >= mde
                else f"no: the MDE is {_times(mde / e['effect'])} the effect"
            )
            lines.append(
                f"| {e['what']} | {manifest['short']} | {e['metric']} | {e['effect']:+.3f} | "
                f"{mde:.3f} | {which} | {yes} |"
            )
    return "\n".join(lines) + "\n"


def replace_sections(text: str, sections: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with each generated section's body replaced; the names in ``sections`` that
    ``text`` has no markers for are returned (a section nobody reads is an error upstream)."""
    found: list[str] = []

    def swap(m: re.Match) -> str:
        name = m.group(2)
        if name not in sections:
            return m.group(0)
        found.append(name)
        return m.group(1) + sections[name] + m.group(4)

    out = SECTION.sub(swap, text)
    return out, [n for n in sections if n not in found]


def build(root: Path, notes: list[str] | None = None) -> dict[Path, str]:
    """Every file the archives give, path → text: each archive's reports (markdown and JSON,
    one pair per metric, and ``comparison<suffix>_test.*`` of a held-out test split) and
    ``docs/results.md`` with its generated sections replaced. ``notes`` (a list) gets a line
    for each archive without a test split."""
    archives = []
    files: dict[Path, str] = {}
    sections: dict[str, str] = {}
    for folder in find_archives(root):
        if _kind(folder) == "demo":
            report, sections["demo"] = demo_section(folder, root)
            files[folder / "report.md"] = report
            continue
        manifest = load_manifest(folder)
        by_metric, test = summaries(folder, manifest, root)
        archives.append((folder, manifest, by_metric))
        suffixes = report_files(manifest, by_metric, root)
        for suffix, (metric, s) in zip(suffixes, by_metric.items(), strict=True):
            files[folder / f"comparison{suffix}.md"] = markdown(s)
            files[folder / f"comparison{suffix}.json"] = summary_json(s)
            if metric in test:
                files[folder / f"comparison{suffix}_test.md"] = markdown(test[metric])
                files[folder / f"comparison{suffix}_test.json"] = summary_json(test[metric])
        if not test and notes is not None:
            notes.append(f"{manifest['name']}: no test split archived")
        sections[manifest["name"]] = archive_section(folder, manifest, by_metric, root, test)
    if not sections:
        raise FileNotFoundError(f"{root}: no archived comparison (*/results/**/{ARCHIVE_FILE})")
    if archives:
        sections["summary"] = summary_section(archives, root)
        sections["detectable"] = detectable_section(archives)
    docs = root / DOCS
    text, unplaced = replace_sections(docs.read_text(encoding="utf-8"), sections)
    if unplaced:
        raise ValueError(
            f"{docs}: no `<!-- results:begin NAME -->` section for {', '.join(unplaced)}"
        )
    files[docs] = text
    return files


def _kind(folder: Path) -> str:
    data = yaml.safe_load((folder / ARCHIVE_FILE).read_text(encoding="utf-8"))
    return data.get("kind", "comparison") if isinstance(data, dict) else "comparison"


def demo_section(folder: Path, root: Path) -> tuple[str, str]:
    """The demo archive's report and its docs table (``experiments.demo_report``), each run's
    numbers checked against its per-question files."""
    from experiments.demo_report import archived_runs, check_per_question, markdown, summarize_run
    from experiments.demo_report import table as demo_table

    runs = []
    for label, run in archived_runs(folder):
        s = summarize_run(label, run)
        if "missing" in s:
            raise ValueError(f"{run}: {s['missing']} (the demo archive's run {label!r})")
        check_per_question(s)
        runs.append(s | {"run_dir": run.relative_to(root).as_posix()})
    return markdown(runs, "curves.png"), "\n".join(demo_table(runs)) + "\n"


def stale_files(files: dict[Path, str]) -> list[Path]:
    """The paths whose text on disk is not what the archives give (or that are missing)."""
    return [p for p, t in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != t]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.results", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--root", default=".", help="the repository root (default: here)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file or table differs"
    )
    args = parser.parse_args(argv)
    notes: list[str] = []
    try:
        files = build(Path(args.root), notes)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in notes:
        print(f"[results] {line}")
    stale = stale_files(files)
    if args.check:
        for p in stale:
            print(f"differs from what the archives give: {p}", file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(files[p], encoding="utf-8")
    print(f"[results] {len(files)} files recomputed from the archives, {len(stale)} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
