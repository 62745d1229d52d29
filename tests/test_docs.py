"""Every command, file and module the docs name still exists: read from the Markdown, nothing run
but ``--help`` (slow test only)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_READMES = [
    "arco/README.md",
    "cer/README.md",
    "eviback/README.md",
    "benchmarks/README.md",
    "benchmarks/RESULTS.md",
    "common/tinyworld/README.md",
]
# the pages whose commands, paths and modules must exist (CHANGELOG.md names old ones on purpose)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] + [
    ROOT / p for p in PACKAGE_READMES
]
# every Markdown file of the project, for the rules that hold everywhere
ALL_MD = [
    p
    for p in ROOT.rglob("*.md")
    if not {".venv", "runs", ".git", ".pytest_cache", "node_modules"}
    & set(p.relative_to(ROOT).parts)
]
CODE_ROOTS = ("arco", "cer", "eviback", "common", "experiments", "benchmarks", "tests", "scripts")


def code_text(path: Path) -> str:
    """The code of a Markdown file: fenced blocks, 4-space indented blocks and inline spans."""
    text = path.read_text(encoding="utf-8")
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    indented = re.findall(r"^(?: {4}|\t)(\S.*)$", prose, flags=re.M)
    inline = re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose)  # a span may wrap once
    return "\n".join(fenced + indented + inline)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, flags=re.M))


def named_make_targets(path: Path) -> set[str]:
    named = re.findall(r"(?:^|[\s;(])make ([a-z][\w-]*)", code_text(path), flags=re.M)
    return {t for t in named if not t.endswith("-")}  # `make compare-*`: a family, not a target


def named_modules(path: Path) -> set[str]:
    code = code_text(path)
    return set(re.findall(r"(?:python|python3) -m ([A-Za-z_][\w.]*)", code)) | set(
        re.findall(r"--module ([A-Za-z_][\w.]*)", code)
    )


def module_file(name: str) -> Path | None:
    """The file of a project module by its dotted name, found on disk (nothing imported)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def named_paths(path: Path) -> set[str]:
    roots = "|".join(CODE_ROOTS)
    found = re.findall(rf"(?<![\w./<-])((?:{roots}|\.ci)/[\w./-]*)([{{<*]?)", code_text(path))
    paths = {p.rstrip(".,:;") for p, pattern in found if not pattern and "..." not in p}
    # a file (an extension) or a folder (a slash); `cer/ref_prob_mean` is a metric's name
    return {p for p in paths if p.endswith("/") or re.search(r"\.\w+$", p)}


def named_dotted(path: Path) -> set[str]:
    roots = "|".join(r for r in CODE_ROOTS if r not in ("tests", "scripts", "benchmarks"))
    spans = re.findall(r"`([^`\n]+)`", path.read_text(encoding="utf-8"))
    files = r"\.(?:json|jsonl|yaml|md|py|txt|png|safetensors)$"  # `arco.json` is a file
    return {
        s
        for s in spans
        if re.fullmatch(rf"(?:{roots})(?:\.\w+)+(?::\w+)?", s) and not re.search(files, s)
    }


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def test_the_readme_shows_the_commands_ci_runs():
    """`.ci/run` runs the README's install and test commands: both stay in it, as written."""
    ci = [x.strip() for x in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [x for x in ci if x.startswith("make ")]
    assert commands, ci
    readme = code_text(ROOT / "README.md").splitlines()
    for command in commands:
        assert any(x.split("#")[0].strip() == command for x in readme), command


def test_no_issue_numbers_in_the_docs():
    """Issue numbers belong to the tracker, not the docs."""
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in ALL_MD
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"issue[ -]?#?\d", line, flags=re.I)
    ]
    assert not hits, "\n".join(hits)


def test_the_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, page.name


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_make_target_named_exists(path):
    missing = named_make_targets(path) - make_targets()
    assert not missing, f"{path.relative_to(ROOT)} names make targets the Makefile lacks: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_python_module_named_exists(path):
    missing = set()
    for name in named_modules(path):
        file = module_file(name)
        runnable = file is not None and (
            file.name != "__init__.py" or (file.parent / "__main__.py").is_file()
        )
        if not runnable:
            missing.add(name)
    assert not missing, f"{path.relative_to(ROOT)} names modules that do not run: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_file_named_exists(path):
    missing = {p for p in named_paths(path) if not (ROOT / p).exists()}
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_dotted_name_has_its_module(path):
    """`pkg.module.attr` or `pkg.module:Name`: the module is there, at most two names after it."""
    bad = set()
    for name in named_dotted(path):
        parts = name.replace(":", ".").split(".")
        known = max(
            (k for k in range(1, len(parts) + 1) if module_file(".".join(parts[:k]))), default=0
        )
        if known < 2 or len(parts) - known > 2:
            bad.add(name)
    assert not bad, f"{path.relative_to(ROOT)} names modules that do not exist: {bad}"


@pytest.mark.parametrize(
    "path", [*DOCS, ROOT / "CHANGELOG.md"], ids=ids([*DOCS, ROOT / "CHANGELOG.md"])
)
def test_every_link_resolves(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


@pytest.mark.slow
def test_every_python_module_named_answers_help_or_imports():
    """`python -m X --help` for every module the docs name (a script without a parser: it imports).
    Run side by side, so the slowest start sets the time."""
    names = sorted(set().union(*(named_modules(p) for p in DOCS)))
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", name, "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in names
    }
    failed = {}
    for name, run in runs.items():
        out, _ = run.communicate(timeout=300)
        if run.returncode == 0:
            continue
        imported = subprocess.run(
            [sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True
        )
        if imported.returncode != 0:
            failed[name] = (out + imported.stderr)[-500:]
    assert not failed, failed
