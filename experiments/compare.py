"""Comparisons over seeds: run every arm's seeds, pair per-question dev and test results, bootstrap.

    python -m experiments.compare --spec common/configs/compare_grpo_tiny.yaml [--report-only]

A spec (YAML) names the arms, the seeds and the baseline::

    out: runs/compare/grpo          # each run in <out>/<arm>/s<seed>; the report in <out>/
    seeds: [0, 1, 2]
    metric: em                      # a per-question field of dev_results/step_N.jsonl
    baseline: start                 # an arm's name, or "start": each arm against its step 0
    arms:
      - name: grpo
        command: [python, -m, common.search_grpo, --config, common/configs/grpo_tiny.yaml]
        overrides: [steps=30]

Each run is ``command + run_dir=<out>/<arm>/s<seed> seed=<seed> + overrides``; a run that
finished before (``<run_dir>/.compare_done``) is not run again. Optional: an arm's ``then`` (a list
of commands) runs after its command with the same arguments appended (e.g. a diagnostic that
logs into the run's metrics.jsonl), and ``extra_metrics`` (metrics.jsonl keys, e.g.
``decomposition_error``) adds each arm's last logged value (mean over seeds) to the report and a
curve per key (``curves_<key>.png``); an arm that never logs a key shows a dash. ``{out}`` in
an arm's overrides stands for the spec's ``out``. A smaller version of any comparison (a smoke
test of its wiring): ``--out``, ``--seeds`` and ``--set key=value`` (appended to every arm's
overrides, so they win); ``--arms A B`` runs and reports a subset (the baseline always).
``--archive DIR`` copies each run's per-question results, metrics.jsonl and config.yaml into
``DIR/<arm>/s<seed>`` (beside the seeds DIR holds from before) and reports over DIR: a
comparison run seed by seed, over sessions, keeps its results with the code; a first archive
also gets ``DIR/archive.yaml`` (the spec, metric, command and commit), from which ``make
results`` (``experiments.results``) recomputes its reports and its tables in docs/results.md.
``--metric NAME`` reports another per-question field of the same runs (``comparison_NAME.md``,
``.json`` and ``curves_NAME.png`` beside the spec metric's report), e.g. containment and F1 of
the short answers exact match judges.
Every trainer writes its dev evaluations per question (``common.rl_loop.evaluate``), so arms are
compared on the same questions: for question q, Δ_q = mean over seeds of the arm's final value minus the baseline's
(with ``start``: the arm's own final minus step-0 value, seed by seed). Two percentile-bootstrap
intervals of mean(Δ) stand beside each other (``common.bootstrap``): over questions with the
seeds fixed, and over seeds and questions (each draw takes the seeds and the questions with
replacement, the arm's seed s against the reference's seed s), which counts what other seeds
could give. A verdict (above, below or across 0) uses the second with two seeds or more, the
first with one; the report bolds only that interval, when it is clear of 0. Beside each interval
its minimal detectable difference: 2.8 standard errors (a two-sided 5% test with 80% power; of
the per-question Δ for the first, the draws' spread for the second); n is the number of dev
questions. For every arm with two
seeds or more the report adds its **seed noise**: from the arm's spread over seeds per question,
what a comparison of two arms that differ only by seed (same seeds, same questions) could detect,
and the questions it would need to detect one point; the bound to quote before running a slow
arm against it.

**Held-out test split.** Where settings were chosen on dev, the result is also reported on a
split nothing was chosen on. The trainer writes it, reusing its own evaluation: the reference
GRPO loop evaluates its test split (the world's test.jsonl, or the test.jsonl beside
``assets.train``) at step 0 and the last step into ``<run_dir>/test_results/step_N.jsonl``, rows
as dev_results'. When some run has them, the report adds ``comparison_test.md``/``.json``
(``comparison_NAME_test.*`` under ``--metric``): the same tables, intervals and MDEs over the test
questions, Δ paired as on dev (final against step 0 or against the baseline arm's final), and
comparison.md names it; ``--archive`` copies test_results/ too. A run without test results
after step 0 is missing there; with none at all, there is no test report.

``--report-only`` (and the report after the runs) reports what is there: a seed without step-0
dev results is named as missing and left out (each arm over its seeds present, Δ against an arm
over the seeds both have); a seed without the runner's done marker is marked unfinished (``*``,
``unfinished_seeds`` in the JSON) with its own last evaluated step. metrics.jsonl is read as the
trainers read it (``common.train.logging.read_metrics``: a torn last line dropped with a warning).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from common.bootstrap import MDE_Z, paired_bootstrap, two_level_bootstrap
from common.config import path_name
from common.launcher import write_failure

DONE_MARKER = ".compare_done"


def read_results(path: Path) -> dict[str, dict[str, Any]]:
    """A ``dev_results/step_N.jsonl`` file by question id; a bad line names the file and line."""
    out: dict[str, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                row = json.loads(line)
                out[row["id"]] = row
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{lineno}: not a per-question result ({err!r})") from None
    return out


def result_steps(run_dir: Path, split: str = "dev") -> list[int]:
    """The steps at which the run wrote per-question results of ``split`` (``dev``, or
    ``test``: the held-out split), ascending."""
    folder = run_dir / f"{split}_results"
    return sorted(int(p.stem.split("_")[1]) for p in folder.glob("step_*.jsonl"))


def run_results(run_dir: Path, split: str = "dev") -> tuple[dict, dict, int]:
    """The run's step-0 and final per-question results of ``split``, and the final step; on
    the test split the final step must come after step 0 (the trained policy)."""
    steps, folder = result_steps(run_dir, split), f"{split}_results"
    if not steps or steps[0] != 0:
        raise FileNotFoundError(f"{run_dir}: no per-question {split} results at step 0 ({folder}/)")
    if split != "dev" and steps[-1] == 0:
        raise FileNotFoundError(f"{run_dir}: no per-question {split} results after step 0")
    start = read_results(run_dir / folder / "step_00000.jsonl")
    final = read_results(run_dir / folder / f"step_{steps[-1]:05d}.jsonl")
    return start, final, steps[-1]


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl as the trainers read it (``common.train.logging.read_metrics``: a
    torn last line dropped with a warning, a bad line elsewhere an error naming file and line);
    no file: no rows."""
    from common.train.logging import read_metrics

    path = run_dir / "metrics.jsonl"
    return read_metrics(path) if path.is_file() else []


def curve(per_run: Sequence[Sequence[dict]], key: str = "dev/em") -> dict[str, list[float]]:
    """``{"step", "mean", "low", "high"}`` of ``key`` over the runs' metrics.jsonl rows, at the
    steps every run logged it (runs without metrics.jsonl left out)."""
    logged = [{r["step"]: r[key] for r in rows if key in r} for rows in per_run if rows]
    steps = sorted(set.intersection(*(set(p) for p in logged))) if logged else []
    values = [[p[s] for p in logged] for s in steps]
    return {
        "step": steps,
        "mean": [statistics.fmean(v) for v in values],
        "low": [min(v) for v in values],
        "high": [max(v) for v in values],
    }


def mean_of(rows: dict[str, dict], field: str, path: Path) -> float:
    """The mean of a per-question field; a field the rows lack names the file."""
    try:
        return statistics.fmean(float(r[field]) for r in rows.values())
    except KeyError:
        raise ValueError(f"{path}: the per-question rows have no `{field}` field") from None


def seed_result(run_dir: Path, seed: int, metric: str, split: str = "dev") -> dict[str, Any]:
    """One seed's results on ``split``: ``start``/``final`` rows and values, ``final_step`` (its
    own last evaluation) and ``finished`` (the runner's done marker is there)."""
    start, final, step = run_results(run_dir, split)
    last = run_dir / f"{split}_results" / f"step_{step:05d}.jsonl"
    valid = [float(r["valid"]) for r in final.values() if "valid" in r]
    return {
        "seed": seed,
        "dir": run_dir,
        "start_rows": start,
        "final_rows": final,
        "final_step": step,
        "finished": (run_dir / DONE_MARKER).exists(),
        "start": mean_of(start, metric, run_dir / f"{split}_results" / "step_00000.jsonl"),
        "final": mean_of(final, metric, last),
        "valid": statistics.fmean(valid) if valid and len(valid) == len(final) else None,
    }


def summarize(spec: dict, resamples: int = 10_000, split: str = "dev") -> dict[str, Any]:
    """Finals per arm and seed, the curves, and each arm against the baseline, over the seeds
    present: a seed without step-0 results of ``split`` (dev, or test: the held-out split) is
    listed as missing, one without the runner's done marker as unfinished; an arm is compared
    with the baseline arm over the seeds both have. Only when no run has results at all is it
    an error."""
    out_dir, metric = Path(spec["out"]), spec.get("metric", "em")
    arms: dict[str, dict[str, Any]] = {}
    missing: list[dict[str, Any]] = []
    for arm in spec["arms"]:
        name, seeds = arm["name"], []
        for s in spec["seeds"]:
            run_dir = out_dir / name / f"s{s}"
            try:
                seeds.append(seed_result(run_dir, s, metric, split))
            except FileNotFoundError as err:
                missing.append({"arm": name, "seed": s, "why": str(err)})
        gone = [m["seed"] for m in missing if m["arm"] == name]
        arms[name] = arm_summary(seeds, gone, spec, split)
    if not any(a["seeds_present"] for a in arms.values()):
        raise FileNotFoundError(f"no run has results yet: {missing[0]['why']}")
    baseline = spec.get("baseline", "start")
    comparisons, not_compared = {}, {}
    for name, a in arms.items():
        if name == baseline:
            continue
        if baseline == "start":
            seeds = a["seeds_present"]
        else:
            seeds = [s for s in a["seeds_present"] if s in arms[baseline]["seeds_present"]]
        if not seeds:
            not_compared[name] = (
                "no seed with results"
                if baseline == "start" or not a["seeds_present"]
                else f"no seed that `{baseline}` has too"
            )
            continue
        runs = {s["seed"]: s for s in a["runs"]}
        finals = [runs[s]["final_rows"] for s in seeds]
        if baseline == "start":
            refs = [runs[s]["start_rows"] for s in seeds]
            diffs = diffs_from_start(finals, refs, metric)
        else:
            theirs = {s["seed"]: s for s in arms[baseline]["runs"]}
            refs = [theirs[s]["final_rows"] for s in seeds]
            diffs = question_diffs(finals, refs, metric)
        comparisons[name] = compare_arm(diffs, finals, refs, metric, resamples) | {"seeds": seeds}
    unfinished = [
        {"arm": n, "seed": s["seed"], "final_step": s["final_step"]}
        for n, a in arms.items()
        for s in a["runs"]
        if not s["finished"]
    ]
    return {
        **({"split": split} if split != "dev" else {}),  # a dev summary's JSON as before
        "metric": metric,
        "baseline": baseline,
        "seeds": spec["seeds"],
        "arms": arms,
        "comparisons": comparisons,
        "not_compared": not_compared,
        "missing": missing,
        "unfinished": unfinished,
    }


def arm_summary(
    runs: list[dict[str, Any]], missing: list[int], spec: dict, split: str = "dev"
) -> dict[str, Any]:
    """One arm over its seeds present (``runs``, from ``seed_result``); its curve is the
    logged ``<split>/<metric>`` (none on the test split: it is evaluated at the ends only)."""
    metric = spec.get("metric", "em")
    rows = [metrics_rows(r["dir"]) for r in runs]
    finals = [r["final"] for r in runs]
    valid = [r["valid"] for r in runs]
    steps = [r["final_step"] for r in runs]
    keep = ("seed", "final_step", "finished", "start", "final", "valid")
    return {
        "runs": runs,  # with the per-question rows (left out of comparison.json)
        "per_seed": [{k: r[k] for k in keep} for r in runs],
        "seeds_present": [r["seed"] for r in runs],
        "seeds_missing": missing,
        "unfinished_seeds": [r["seed"] for r in runs if not r["finished"]],
        "final_step": steps[0] if steps and len(set(steps)) == 1 else None,
        "final_step_per_seed": steps,
        "start": statistics.fmean(r["start"] for r in runs) if runs else None,
        "final": statistics.fmean(finals) if runs else None,
        "final_per_seed": finals,
        "final_seed_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "seed_noise": seed_noise([r["final_rows"] for r in runs], metric),
        "valid_final": statistics.fmean(valid) if runs and None not in valid else None,
        "curve": curve(rows, f"{split}/{metric}"),
        "extras": {key: extra_metric(rows, key) for key in spec.get("extra_metrics", [])},
    }


def extra_metric(per_run: Sequence[Sequence[dict]], key: str) -> dict[str, Any] | None:
    """The last logged value of ``key`` per run (its metrics.jsonl rows), their mean and the
    curve over the steps every run logged it; None when some run never logs it (an arm without
    that part) or there are no runs."""
    last = []
    for rows in per_run:
        values = [r[key] for r in rows if key in r]
        if not values:
            return None
        last.append(float(values[-1]))
    if not last:
        return None
    return {"final": statistics.fmean(last), "per_seed": last, "curve": curve(per_run, key)}


def question_diffs(
    arm: Sequence[dict[str, dict]], base: Sequence[dict[str, dict]], metric: str
) -> list[float]:
    """Per question: mean over ``arm``'s runs minus mean over ``base``'s runs of ``metric``.

    Both lists hold one ``{question id: row}`` per seed; every run must cover the same questions.
    """
    ids = list(arm[0])
    for runs in (arm, base):
        for r in runs:
            if set(r) != set(ids):
                raise ValueError("paired runs must cover the same dev questions")

    def mean(runs: Sequence[dict], q: str) -> float:
        return statistics.fmean(float(r[q][metric]) for r in runs)

    return [mean(arm, q) - mean(base, q) for q in ids]


def seed_noise(finals: Sequence[dict[str, dict]], metric: str) -> dict[str, float] | None:
    """What a comparison of two arms that differ only by seed could detect, from one arm's runs.

    ``finals`` holds one ``{question id: row}`` per seed (k ≥ 2 seeds, the same questions). For
    question q, v_q is the sample variance of ``metric`` over the seeds; two independent arms
    each averaged over k seeds differ at q with variance 2 v_q / k, so over n questions the
    paired difference has ``sd = sqrt(mean_q 2 v_q / k)`` and ``mde = 2.8 sd / sqrt(n)``: the
    smallest difference a comparison of this design (k seeds, n questions) detects with 80%
    power when the arms' only difference is training noise (a lower bound when the effect varies
    by question). ``questions_per_point``: the questions a comparison needs to detect 0.01,
    ``(2.8 sd / 0.01)²``. None with fewer than two seeds."""
    k = len(finals)
    if k < 2:
        return None
    ids = list(finals[0])
    if any(set(r) != set(ids) for r in finals):
        raise ValueError("seed_noise: the seeds' runs must cover the same dev questions")
    var = [statistics.variance([float(r[q][metric]) for r in finals]) for q in ids]
    sd = math.sqrt(2 * statistics.fmean(var) / k)
    return {
        "seeds": k,
        "n": len(ids),
        "sd": sd,
        "mde": MDE_Z * sd / math.sqrt(len(ids)),
        "questions_per_point": (MDE_Z * sd / 0.01) ** 2,
    }


def diffs_from_start(finals: Sequence[dict], starts: Sequence[dict], metric: str) -> list:
    """Per question: the mean over seeds of (final − start), each seed against its own start."""
    ids = list(finals[0])
    return [
        statistics.fmean(
            float(f[q][metric]) - float(s[q][metric]) for f, s in zip(finals, starts, strict=True)
        )
        for q in ids
    ]


def seed_table(runs: Sequence[dict[str, dict]], ids: Sequence[str], metric: str) -> list[list]:
    """``metric`` of each run (one ``{question id: row}`` per seed) over the questions ``ids``:
    one row per seed."""
    return [[float(r[q][metric]) for q in ids] for r in runs]


def clear_of_zero(interval: dict[str, float]) -> int:
    """+1 when the interval lies above 0, −1 below, 0 when it holds or touches 0."""
    return 1 if interval["ci_low"] > 0 else -1 if interval["ci_high"] < 0 else 0


def compare_arm(
    diffs: Sequence[float],
    finals: Sequence[dict[str, dict]],
    refs: Sequence[dict[str, dict]],
    metric: str,
    resamples: int = 10_000,
) -> dict[str, Any]:
    """One arm against its reference over the same seeds (``finals[i]`` against ``refs[i]``):
    the bootstrap over questions of the per-question ``diffs`` with the seeds fixed (top level:
    ``n`` questions, ``delta``, ``ci_low``, ``ci_high``, ``mde``, ``p_le_0``), the two-level
    bootstrap over seeds and questions (``seeds_and_questions``), and ``verdict``: which of the
    two a verdict uses (``seeds_and_questions`` with two seeds or more, else ``questions``) and
    its ``sign`` (``clear_of_zero``)."""
    ids = list(finals[0])
    fixed = paired_bootstrap(diffs, resamples)
    both = two_level_bootstrap(
        seed_table(finals, ids, metric), seed_table(refs, ids, metric), resamples
    )
    by = "seeds_and_questions" if len(finals) >= 2 else "questions"
    sign = clear_of_zero(both if by == "seeds_and_questions" else fixed)
    return {**fixed, "seeds_and_questions": both, "verdict": {"interval": by, "sign": sign}}


def verdict_cells(c: dict[str, Any]) -> str:
    """The markdown cells of a comparison: Δ's two intervals, each with its MDE, and the
    verdict; only the interval the verdict uses is bolded, and only when it is clear of 0."""
    v = c.get("verdict", {"interval": "questions", "sign": clear_of_zero(c)})
    two = c.get("seeds_and_questions")

    def ci(x: dict[str, float], used: bool) -> str:
        text = f"[{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"
        return f"**{text}**" if used and v["sign"] else text

    fixed = f"{ci(c, v['interval'] == 'questions')} | {c['mde']:.3f}"
    both = f"{ci(two, v['interval'] == 'seeds_and_questions')} | {two['mde']:.3f}" if two else " | "
    word = {1: "**above 0**", -1: "**below 0**", 0: "across 0"}[v["sign"]]
    by = "seeds + questions" if v["interval"] == "seeds_and_questions" else "questions"
    return f"{fixed} | {both} | {word} ({by})"


def _seeds(seeds: Sequence[int]) -> str:
    return ", ".join(f"s{s}" for s in seeds)


HELD_OUT = (
    "**Held-out test split**: each run's final policy and its step 0 on the test questions, "
    "which no setting of the comparison was chosen on."
)
AFTER = {"test": " or after it"}  # what a test split's missing seed lacks besides step 0


def markdown(summary: dict[str, Any]) -> str:
    m, base = summary["metric"], summary["baseline"]
    split = summary.get("split", "dev")
    against = "its own step 0" if base == "start" else f"`{base}`"
    ns = sorted({c["n"] for c in summary["comparisons"].values()})
    n = f"n = {' / '.join(map(str, ns))} {split} questions, " if ns else ""
    lines = [] if split == "dev" else [HELD_OUT, ""]
    lines += [
        f"Seeds {summary['seeds']}; {split} {m} (greedy); {n}Δ against {against} per question, "
        "pooled over seeds. Two 95% percentile-bootstrap intervals, each with its MDE (2.8 SE, "
        "80% power): over questions with the seeds fixed, and over seeds and questions (both "
        "drawn with replacement, arm seed s against reference seed s: seed noise included). "
        "The verdict uses the seeds + questions interval with two seeds or more, else the "
        "questions one; only that interval is bolded, when clear of 0.",
    ]
    missing = summary.get("missing", [])
    unfinished = summary.get("unfinished", [])
    if missing:
        names = ", ".join(f"{x['arm']} s{x['seed']}" for x in missing)
        lines.append(
            f"Missing (no {split} results at step 0{AFTER.get(split, '')}): {names}; the numbers "
            "below are over the seeds present, and each Δ against an arm over the seeds both have."
        )
    if unfinished:
        names = ", ".join(f"{x['arm']} s{x['seed']} (step {x['final_step']})" for x in unfinished)
        lines.append(
            f"Unfinished (*: no `{DONE_MARKER}`, the run stopped or still runs; its last {split} "
            f"results are used): {names}."
        )
    lines += [
        "",
        f"| arm | step | {m} at step 0 | final {m} (mean ± sd over seeds) | per seed | valid answers"
        " | Δ | 95% CI, questions (seeds fixed) | MDE | 95% CI, seeds + questions | MDE | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    all_seeds = list(summary["seeds"])
    for name, a in summary["arms"].items():
        if not a["seeds_present"]:
            lines.append(f"| {name} | – | missing: no seed has results | | | | | | | | | |")
            continue
        c = summary["comparisons"].get(name)
        if c:
            over = "" if c["seeds"] == all_seeds else f" ({_seeds(c['seeds'])})"
            delta = f"{c['delta']:+.3f}{over} | {verdict_cells(c)}"
        elif name in summary.get("not_compared", {}):
            delta = f"– ({summary['not_compared'][name]}) | | | | | "
        else:
            delta = "(baseline) | | | | | "
        per_seed = a["per_seed"]
        whole = a["seeds_present"] == all_seeds and not a["unfinished_seeds"]
        if whole and a["final_step"] is not None:
            step = str(a["final_step"])
            seeds = ", ".join(f"{p['final']:.3f}" for p in per_seed)
        else:
            mark = {p["seed"]: "" if p["finished"] else "*" for p in per_seed}
            step = ", ".join(f"s{p['seed']} {p['final_step']}{mark[p['seed']]}" for p in per_seed)
            seeds = ", ".join(f"s{p['seed']} {p['final']:.3f}{mark[p['seed']]}" for p in per_seed)
        valid = "–" if a["valid_final"] is None else f"{a['valid_final']:.2f}"
        lines.append(
            f"| {name} | {step} | {a['start']:.3f} | {a['final']:.3f} ± "
            f"{a['final_seed_sd']:.3f} | {seeds} | {valid} | {delta} |"
        )
    noise = {n: a["seed_noise"] for n, a in summary["arms"].items() if a.get("seed_noise")}
    if noise:
        lines += [
            "",
            "Seed noise: what a comparison of two arms that differ only by seed could detect, "
            "from each arm's spread over its seeds per question (same seeds and questions; 80% "
            "power; questions to detect 0.01 at this many seeds in the last column).",
            "",
            "| arm | seeds | questions | sd of Δ per question | MDE | questions for ±0.01 |",
            "|---|---|---|---|---|---|",
        ]
        for name, z in noise.items():
            lines.append(
                f"| {name} | {z['seeds']} | {z['n']} | {z['sd']:.3f} | {z['mde']:.3f} | "
                f"{z['questions_per_point']:,.0f} |"
            )
    keys = [k for a in summary["arms"].values() for k in a.get("extras", {})]
    keys = list(dict.fromkeys(keys))
    if keys:
        lines += ["", "Last logged value, mean over seeds (– : the arm does not log it).", ""]
        lines += ["| arm | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for name, a in summary["arms"].items():
            cells = [a["extras"].get(k) for k in keys]
            text = [f"{c['final']:.3f}" if c else "–" for c in cells]
            lines.append(f"| {name} | " + " | ".join(text) + " |")
    if summary.get("test_report"):
        lines += [
            "",
            f"Held-out test split: `{summary['test_report']}` (the same tables on the test questions).",
        ]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: Path, key: str | None = None) -> Path:
    """One line per arm (mean over seeds) with the min-max band over seeds: the dev metric, or
    the extra metric ``key`` (arms that log it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, a in summary["arms"].items():
        c = a["curve"] if key is None else (a["extras"].get(key) or {}).get("curve")
        if not c or not c["step"]:
            continue
        ax.plot(c["step"], c["mean"], marker="o", ms=3, label=name)
        ax.fill_between(c["step"], c["low"], c["high"], alpha=0.2)
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"dev {summary['metric']} (greedy)" if key is None else key)
    ax.set_title(f"mean and range over seeds {summary['seeds']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def load_spec(path: str | Path) -> dict[str, Any]:
    """The spec, with its keys checked (one-line errors naming the key)."""
    try:
        spec = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise FileNotFoundError(f"--spec {path}: cannot read it ({err.strerror})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        why = getattr(err, "problem", None) or " ".join(str(err).split())
        raise ValueError(f"{path}: not valid YAML{where}: {why}") from None
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: expected a mapping of keys (out, seeds, arms, ...)")
    for key in ("out", "seeds", "arms"):
        if key not in spec:
            raise ValueError(f"{path}: missing key `{key}`")
    if not isinstance(spec["out"], str) or not spec["out"]:
        raise ValueError(f"{path}: `out` must be a folder, not {spec['out']!r:.60}")
    seeds = spec["seeds"]
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ValueError(
            f"{path}: `seeds` must be a list of integers, e.g. [0, 1, 2], not {seeds!r:.60}"
        )
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{path}: `seeds` repeat: {seeds}")
    if not isinstance(spec["arms"], list) or not spec["arms"]:
        raise ValueError(f"{path}: `arms` must be a list of arms (each with `name`, `command`)")
    for i, arm in enumerate(spec["arms"]):
        if not isinstance(arm, dict) or not arm.get("name") or not arm.get("command"):
            raise ValueError(f"{path}: arms[{i}] needs `name` and `command`")
        path_name(arm["name"], f"{path}: arms[{i}].name")  # each arm is a folder under `out`
        for key in ("command", "overrides"):
            value = arm.get(key, [])
            if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
                raise ValueError(f"{path}: arms[{i}].{key} must be a list of strings")
    names = [a["name"] for a in spec["arms"]]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: arm names repeat: {names}")
    for key in ("metric", "baseline"):
        if key in spec and not (isinstance(spec[key], str) and spec[key]):
            raise ValueError(f"{path}: `{key}` must be a name, not {spec[key]!r:.60}")
    base = spec.get("baseline", "start")
    if base != "start" and base not in names:
        raise ValueError(f"{path}: baseline `{base}` is not an arm ({names}) nor `start`")
    for i, arm in enumerate(spec["arms"]):
        then = arm.get("then", [])
        if not isinstance(then, list) or not all(
            isinstance(c, list) and c and all(isinstance(x, str) for x in c) for c in then
        ):
            raise ValueError(f"{path}: arms[{i}].then must be a list of commands (lists)")
    extra = spec.get("extra_metrics", [])
    if not isinstance(extra, list) or not all(isinstance(k, str) for k in extra):
        raise ValueError(f"{path}: `extra_metrics` must be a list of metrics.jsonl keys")
    return spec


def with_command_line(
    spec: dict[str, Any],
    out: str | None,
    seeds: Sequence[int] | None,
    sets: Sequence[str],
    arms: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The spec with ``out`` and ``seeds`` replaced when given, only the ``arms`` named (in the
    spec's order; the baseline arm is kept), ``sets`` appended to every arm's overrides, and
    ``{out}`` in the overrides replaced by the output folder."""
    spec = {**spec, "out": out or spec["out"], "seeds": list(seeds or spec["seeds"])}
    if arms:
        names = [a["name"] for a in spec["arms"]]
        unknown = [a for a in arms if a not in names]
        if unknown:
            raise ValueError(f"--arms: no arm named {', '.join(unknown)}; the spec has {names}")
        base = spec.get("baseline", "start")  # "start": no baseline arm to keep
        keep = {*arms, base}
        spec["arms"] = [a for a in spec["arms"] if a["name"] in keep]
    spec["arms"] = [
        {
            **arm,
            "overrides": [
                o.replace("{out}", str(spec["out"])) for o in [*arm.get("overrides", []), *sets]
            ],
        }
        for arm in spec["arms"]
    ]
    return spec


def run_arms(spec: dict[str, Any]) -> None:
    """Run every (arm, seed) that has not finished, one after the other, showing progress."""
    out_dir = Path(spec["out"])
    todo = [(a, s) for a in spec["arms"] for s in spec["seeds"]]
    for i, (arm, seed) in enumerate(todo, start=1):
        run_dir = out_dir / arm["name"] / f"s{seed}"
        if (run_dir / DONE_MARKER).exists():
            print(f"[compare] {i}/{len(todo)} {arm['name']} seed {seed}: done before", flush=True)
            continue
        args = [f"run_dir={run_dir}", f"seed={seed}", *arm.get("overrides", [])]
        run_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with (run_dir / "compare.log").open("w") as log:
            for command in [arm["command"], *arm.get("then", [])]:
                cmd = [sys.executable if c == "python" else c for c in command] + args
                print(
                    f"[compare] {i}/{len(todo)} {arm['name']} seed {seed}: {' '.join(cmd)}",
                    flush=True,
                )
                log.flush()
                rc = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ
                ).returncode
                if rc:
                    raise RuntimeError(
                        f"{arm['name']} seed {seed} failed (exit {rc}); see {log.name}"
                    )
        (run_dir / DONE_MARKER).write_text(f"{time.perf_counter() - t0:.0f} s\n")
        print(f"[compare]   finished in {time.perf_counter() - t0:.0f} s", flush=True)


def report_suffix(spec: dict[str, Any]) -> str:
    """``_NAME`` of the report files under ``--metric NAME`` (comparison_NAME.md), else ''."""
    return f"_{spec['report_metric']}" if spec.get("report_metric") else ""


def write_report(summary: dict[str, Any], out_dir: Path, suffix: str = "") -> str:
    """``comparison<suffix>.md`` and ``.json`` of a summary (the JSON without the per-question
    rows) into ``out_dir``; returns the markdown."""
    text = markdown(summary)
    (out_dir / f"comparison{suffix}.md").write_text(text, encoding="utf-8")
    (out_dir / f"comparison{suffix}.json").write_text(summary_json(summary), encoding="utf-8")
    return text


def summary_json(summary: dict[str, Any]) -> str:
    """comparison.json's text: the summary without the per-question rows."""
    slim = {
        **summary,
        "arms": {
            n: {k: v for k, v in a.items() if k != "runs"} for n, a in summary["arms"].items()
        },
    }
    return json.dumps(slim, indent=1) + "\n"


def has_split(spec: dict[str, Any], split: str) -> bool:
    """Whether some run of the spec has per-question results of ``split`` (``<split>_results/``)."""
    out = Path(spec["out"])
    runs = (out / a["name"] / f"s{s}" for a in spec["arms"] for s in spec["seeds"])
    return any((r / f"{split}_results").is_dir() for r in runs)


def summarize_splits(
    spec: dict[str, Any], suffix: str = "", resamples: int = 10_000
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The dev summary and, where some run has held-out test results after step 0, the test
    one (no extra metrics: those are logged, not per question); the dev summary then names the
    test report, ``comparison<suffix>_test.md``."""
    dev = summarize(spec, resamples)
    if not has_split(spec, "test"):
        return dev, None
    try:
        test = summarize({**spec, "extra_metrics": []}, resamples, split="test")
    except FileNotFoundError:  # only step-0 test results so far: nothing trained to report
        return dev, None
    return {**dev, "test_report": f"comparison{suffix}_test.md"}, test


def report(spec: dict[str, Any]) -> str:
    out_dir = Path(spec["out"])
    suffix = report_suffix(spec)
    summary, test = summarize_splits(spec, suffix)
    text = write_report(summary, out_dir, suffix)
    if test:
        text += "\n" + write_report(test, out_dir, f"{suffix}_test")
    plot(summary, out_dir / f"curves{suffix}.png")
    for key in spec.get("extra_metrics", []):
        if any(a["extras"].get(key) for a in summary["arms"].values()):
            plot(summary, out_dir / f"curves_{key.replace('/', '_')}.png", key)
    return text


ARCHIVED = ("metrics.jsonl", "config.yaml", DONE_MARKER)
RESULT_FOLDERS = ("dev_results", "test_results")  # per question: what the reports pair


def archive(spec: dict[str, Any], dest: Path) -> list[Path]:
    """Copy what the report reads of every run present (``dev_results/``, ``test_results/``
    where it has them, metrics.jsonl, the done marker) and its config.yaml into
    ``dest/<arm>/s<seed>``, beside what ``dest`` already holds: a few hundred KB a run, small
    enough to keep with the code, from which ``--report-only --out dest`` reports again and to
    which later seeds add. Returns the runs copied."""
    copied = []
    for arm in spec["arms"]:
        for seed in spec["seeds"]:
            src = Path(spec["out"]) / arm["name"] / f"s{seed}"
            if not (src / "dev_results").is_dir():
                continue
            to = dest / arm["name"] / f"s{seed}"
            if to.resolve() == src.resolve():
                raise ValueError(f"--archive {dest} is the comparison's own folder")
            for folder in RESULT_FOLDERS:
                if (src / folder).is_dir():
                    shutil.copytree(src / folder, to / folder, dirs_exist_ok=True)
            for name in ARCHIVED:
                if (src / name).is_file():
                    shutil.copy2(src / name, to / name)
            copied.append(to)
    return copied


def head_commit() -> str:
    """The checkout's commit (short hash), or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def archive_manifest(dest: Path, spec_path: str, metric: str) -> Path | None:
    """Write ``dest/archive.yaml`` (what ``make results`` reads: ``experiments.results``) when
    the archive has none: the spec, its metric, the command, this checkout's commit, and a name
    and title to edit. Returns the file written, None when one was there."""
    path = dest / "archive.yaml"
    if path.exists():
        return None
    name = "-".join(dest.resolve().parts[-2:])
    manifest = {
        "name": name,
        "title": f"the comparison of {spec_path}",
        "short": name,
        "spec": spec_path,
        "metrics": [metric],
        "command": f"python -m experiments.compare --spec {spec_path}",
        "commit": head_commit(),
    }
    header = (
        "# An archived comparison: `make results` recomputes its reports and its "
        "docs/results.md tables\n# from the per-question results here (experiments/results.py "
        "says what each key means).\n"
    )
    path.write_text(header + yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.compare", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--spec", required=True, help="comparison spec (YAML)")
    parser.add_argument("--report-only", action="store_true", help="no runs; report what is there")
    parser.add_argument("--out", default=None, help="output folder instead of the spec's `out`")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="seeds instead of the spec's"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override appended to every arm (repeatable), e.g. a smoke test's short runs",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run and report only these arms (and the baseline); the others' runs are kept",
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="report this per-question field instead of the spec's metric (comparison_METRIC.md)",
    )
    parser.add_argument(
        "--archive",
        default=None,
        metavar="DIR",
        help="also copy every run's per-question results and metrics into DIR/<arm>/s<seed> "
        "(kept beside DIR's earlier seeds) and report over DIR",
    )
    args = parser.parse_args(argv)
    try:
        spec = with_command_line(load_spec(args.spec), args.out, args.seeds, args.set, args.arms)
        if args.metric:  # it names the report files: comparison_METRIC.md
            path_name(args.metric, "--metric")
            spec = {**spec, "metric": args.metric, "report_metric": args.metric}
        if not args.report_only:
            run_arms(spec)
        print(text := report(spec))
        if args.archive:
            runs = archive(spec, Path(args.archive))
            spec = {**spec, "out": args.archive}
            print(text := report(spec))
            print(f"[compare] archived {len(runs)} runs into {args.archive}")
            if made := archive_manifest(Path(args.archive), args.spec, spec.get("metric", "em")):
                print(
                    f"[compare] wrote {made}: give it a name and title, and docs/results.md a "
                    f"`<!-- results:begin NAME -->` section, then `make results`"
                )
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the disk: full, read-only (one line naming the path)
        if (line := write_failure(err)) is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    s = report_suffix(spec)
    test = f", comparison{s}_test.md" if HELD_OUT in text else ""
    print(
        f"[compare] wrote {spec['out']}/comparison{s}.md, comparison{s}.json{test}, curves{s}.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
