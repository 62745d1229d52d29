"""The docs stay true: every command, file, module, make target and config key they name exists.
Read from the Markdown; nothing run but ``--help`` (slow test only), nothing heavier imported than
the config dataclasses and the three methods' argument parsers. A failure names file:line."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import re
import subprocess
import sys
import typing
from functools import cache
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
# the config class a command's key=value overrides are read into
CONFIGS = {
    "arco": "arco.config:ArcoConfig",
    "cer": "cer.config:CERConfig",
    "eviback": "eviback.config:EviBackConfig",
    "eviback warmup": "common.warmup:WarmupConfig",
    "common.search_grpo": "common.grpo_config:GRPOConfig",
    "common.warmup": "common.warmup:WarmupConfig",
}
METHOD_CLIS = ("arco", "cer", "eviback")
KEY = r"[a-z_][a-z0-9_]*"
# `section.key=value`: a dotted name right before `=`, not inside a path, URL or another name
ASSIGNED = re.compile(rf"(?<![\w.\-/$:@#&?])({KEY}(?:\.{KEY})+)=(?!=)")
# a method's command at the start of a command: `arco train`, `python -m cer eval`,
# `deepspeed ... --module eviback train`, `.venv/bin/arco warmup`
METHOD_COMMAND = re.compile(
    r"(?:^|[;&(]\s*|\bpython3? -m\s+|--module\s+)(?:\.venv/bin/)?(arco|cer|eviback)"
    r"\s+([\w{}|,-]+)([^#;&|]*)"
)


@cache
def code_lines(path: Path) -> list[tuple[int, str]]:
    """The code of a Markdown file with the line each piece starts on: every line of a fenced or
    4-space indented block (a line ending in a backslash joined to the next), every inline span
    (one may wrap once)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[tuple[int, str]] = []
    prose: list[str] = []
    fenced = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
            prose.append("")
            continue
        indented = re.match(r"(?: {4}|\t)(\S.*)$", line)
        if fenced or indented:
            text = line if fenced else indented.group(1)
            if blocks and blocks[-1][1].endswith("\\"):
                blocks[-1] = (blocks[-1][0], blocks[-1][1][:-1].rstrip() + " " + text.strip())
            else:
                blocks.append((number, text))
        prose.append("" if fenced else line)
    text = "\n".join(prose)
    inline = [
        (text.count("\n", 0, m.start()) + 1, m.group(1))
        for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", text)
    ]
    return blocks + inline


def code_text(path: Path) -> str:
    """The code of a Markdown file: fenced blocks, 4-space indented blocks and inline spans."""
    return "\n".join(code for _, code in code_lines(path))


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, flags=re.M))


def named_make_targets(path: Path) -> dict[str, int]:
    """Each make target the page names -> the first line naming it."""
    found: dict[str, int] = {}
    for line, code in code_lines(path):
        for target in re.findall(r"(?:^|[\s;(])make ([a-z][\w-]*)", code, flags=re.M):
            if not target.endswith("-"):  # `make compare-*`: a family, not a target
                found.setdefault(target, line)
    return found


def named_modules(path: Path) -> dict[str, int]:
    """Each module run with ``python -m`` or ``--module`` -> the first line naming it."""
    found: dict[str, int] = {}
    for line, code in code_lines(path):
        for name in re.findall(r"(?:\bpython3? -m|--module) ([A-Za-z_][\w.]*)", code):
            found.setdefault(name, line)
    return found


def module_file(name: str) -> Path | None:
    """The file of a project module by its dotted name, found on disk (nothing imported)."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def installed_module_file(name: str) -> Path | None:
    """The file of an installed module, found from its top-level package's spec and then on disk,
    so that ``vllm.entrypoints.x`` imports nothing of vLLM."""
    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin else None
    for folder in spec.submodule_search_locations or ():
        base = Path(folder).joinpath(*rest)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def runnable(name: str) -> bool:
    """``python -m name`` has something to run: a module, or a package with ``__main__``."""
    file = module_file(name) or installed_module_file(name)
    return file is not None and (
        file.name != "__init__.py" or (file.parent / "__main__.py").is_file()
    )


def named_paths(path: Path) -> dict[str, int]:
    """Each repository path the page names -> the first line naming it."""
    roots = "|".join(CODE_ROOTS)
    found: dict[str, int] = {}
    for line, code in code_lines(path):
        for p, pattern in re.findall(rf"(?<![\w./<-])((?:{roots}|\.ci)/[\w./-]*)([{{<*]?)", code):
            p = p.rstrip(".,:;")
            # a file (an extension) or a folder (a slash); `cer/ref_prob_mean` is a metric's name
            if not pattern and "..." not in p and (p.endswith("/") or re.search(r"\.\w+$", p)):
                found.setdefault(p, line)
    return found


def named_dotted(path: Path) -> set[str]:
    roots = "|".join(r for r in CODE_ROOTS if r not in ("tests", "scripts", "benchmarks"))
    spans = re.findall(r"`([^`\n]+)`", path.read_text(encoding="utf-8"))
    files = r"\.(?:json|jsonl|yaml|md|py|txt|png|safetensors)$"  # `arco.json` is a file
    return {
        s
        for s in spans
        if re.fullmatch(rf"(?:{roots})(?:\.\w+)+(?::\w+)?", s) and not re.search(files, s)
    }


@cache
def config_class(name: str) -> type:
    module, _, attr = CONFIGS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


@cache
def all_config_classes() -> tuple[type, ...]:
    return tuple(dict.fromkeys(config_class(name) for name in CONFIGS))


@cache
def config_sections() -> set[str]:
    """The top-level sections of every trainer's config: ``assets``, ``rl``, ``teacher``, ..."""
    return {
        f.name
        for cls in all_config_classes()
        for f in dataclasses.fields(cls)
        for t in (type_hints(cls)[f.name], *typing.get_args(type_hints(cls)[f.name]))
        if dataclasses.is_dataclass(t)
    }


# a file's name, not a key: `env.json`, `warmup.py`, `train.parquet`
FILE_SUFFIXES = {"json", "jsonl", "md", "py", "yaml", "txt", "parquet", "png", "safetensors", "pt"}
# spans that look like this project's keys but are not, each with its reason
NOT_OUR_KEYS = {
    "warmup.rubric.api_model": "the ARCO release's own config key (its hotpotqa.yaml)",
}


def spanned_keys(path: Path) -> list[tuple[int, str]]:
    """(line, key) for every inline span that is a dotted name under a config section
    (`rl.dense_steps`), a file's name excepted."""
    sections = "|".join(sorted(config_sections()))
    return [
        (line, code)
        for line, code in code_lines(path)
        if re.fullmatch(rf"(?:{sections})(?:\.{KEY})+", code)
        and code.rsplit(".", 1)[1] not in FILE_SUFFIXES
        and code not in NOT_OUR_KEYS
    ]


@cache
def type_hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def resolves(cls: type, parts: list[str]) -> bool:
    """``parts`` name a field of the dataclass ``cls``: a leaf, a section (``section.*``) or a key
    under a mapping field (``reward.fn_args.function``)."""
    field = {f.name: f for f in dataclasses.fields(cls)}.get(parts[0])
    if field is None:
        return False
    rest = parts[1:]
    if not rest:
        return True
    tp = type_hints(cls)[field.name]
    for t in (tp, *typing.get_args(tp)):  # a section may be Optional
        if dataclasses.is_dataclass(t) and (rest == ["*"] or resolves(t, rest)):
            return True
        if t is dict or typing.get_origin(t) is dict:
            return True
    return False


def key_problem(key: str, classes: typing.Sequence[type], assigned: bool) -> str | None:
    """Why ``key`` is no setting of any of ``classes`` (None when it is one)."""
    parts = key.split(".")
    owners = [c for c in classes if resolves(c, parts)]
    if not owners:
        renamed = {
            new for c in classes for old, new in getattr(c, "RENAMED", {}).items() if old == key
        }
        names = ", ".join(c.__name__ for c in classes)
        return f"renamed to {sorted(renamed)}" if renamed else f"no such key in {names}"
    if assigned and all(key in getattr(c, "DERIVED", {}) for c in owners):
        return "derived by the trainer: refused when set"
    return None


def command_config(code: str) -> str | None:
    """The CONFIGS entry a command line's overrides go to (None: not a trainer's command)."""
    method = METHOD_COMMAND.search(code)
    if method:
        both = f"{method.group(1)} {method.group(2)}"
        return both if both in CONFIGS else method.group(1)
    module = re.search(r"(?:\bpython3? -m|--module)\s+([\w.]+)", code)
    return module.group(1) if module and module.group(1) in CONFIGS else None


def assigned_keys(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, key, the command's CONFIGS entry or None) for every ``section.key=`` in the code."""
    return [
        (line, key, command_config(code))
        for line, code in code_lines(path)
        for key in ASSIGNED.findall(code)
    ]


def table_keys(path: Path) -> list[tuple[int, str, str]]:
    """(line, column, key) for every key in a table column headed ``key``, ``new key`` or
    ``old key``; ``section.*`` is a section."""
    found = []
    header: list[str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        for column, cell in zip(header, cells, strict=False):
            if column in ("key", "new key", "old key"):
                for span in re.findall(r"`([^`]+)`", cell):
                    if re.fullmatch(rf"{KEY}(?:\.{KEY})*(?:\.\*)?", span):
                        found.append((number, column, span))
    return found


@cache
def method_parser(method: str) -> argparse.ArgumentParser:
    return importlib.import_module(f"{method}.cli")._parser()


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def method_commands(path: Path) -> list[tuple[int, str, str, list[str]]]:
    """(line, method, subcommand, its --options) for every method command in the code; a
    subcommand written ``{warmup,train}`` or ``train|eval`` is each of them."""
    found = []
    for line, code in code_lines(path):
        for method, sub, rest in METHOD_COMMAND.findall(code):
            options = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)
            for name in filter(None, re.split(r"[{},|]", sub)):
                found.append((line, method, name, options))
    return found


def module_options(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, --option) for every option given to a project module other than the
    three methods' CLIs (theirs are checked against their parsers)."""
    found = []
    for line, code in code_lines(path):
        for module, rest in re.findall(r"\bpython3? -m ([\w.]+)([^#;&|]*)", code):
            if module.split(".")[0] not in METHOD_CLIS and module_file(module):
                for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                    found.append((line, module, option))
    return found


def script_options(path: Path) -> list[tuple[int, str, str]]:
    """(line, script, --option) for every option given to a project script run by its path
    (`python benchmarks/cost_model.py --cer-prompt-len 512`)."""
    roots = "|".join(CODE_ROOTS)
    return [
        (line, script, option)
        for line, code in code_lines(path)
        for script, rest in re.findall(rf"\bpython3? ((?:{roots})/[\w/]+\.py)([^#;&|]*)", code)
        if (ROOT / script).is_file()
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)
    ]


def script_sources(script: str) -> str:
    """A script's source and that of the modules beside it it imports (their shared options)."""
    file = ROOT / script
    text = file.read_text(encoding="utf-8")
    imported = re.findall(r"^(?:from|import) (\w+)", text, flags=re.M)
    siblings = [file.parent / f"{name}.py" for name in imported]
    return "\n".join([text, *(f.read_text(encoding="utf-8") for f in siblings if f.is_file())])


def module_sources(name: str) -> str:
    """The source a module's options are defined in: the module, or a package's ``__init__``,
    ``__main__`` and ``cli``."""
    file = module_file(name)
    files = (
        [file]
        if file.name != "__init__.py"
        else [file.parent / f for f in ("__init__.py", "__main__.py", "cli.py")]
    )
    return "\n".join(f.read_text(encoding="utf-8") for f in files if f.is_file())


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


SAMPLE = """# A page

Run `python -m arco train --variant prm rl.dense_steps=10` or `cer eval`.

```
python -m cer train --config cer/configs/tiny.yaml \\
    reward.type=exact run_dir=runs/x   # a comment with make lint
deepspeed --num_gpus 8 --module eviback warmup steps=3
```

    make world && python -m common.tinyworld build --out runs/w

| key | meaning |
|---|---|
| `assets.model`, `engine.*` | a key and a section |

Prose with `ARMS="arco prm"`, `hf://a.b=c` and a `reward.fn`
`=` split over lines.
Run `python benchmarks/cost_model.py --cer-prompt-len 512`.
"""


def test_code_lines_keep_the_line_each_piece_starts_on(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(SAMPLE, encoding="utf-8")
    lines = code_lines(page)
    assert (
        6,
        "python -m cer train --config cer/configs/tiny.yaml reward.type=exact "
        "run_dir=runs/x   # a comment with make lint",
    ) in lines
    assert (8, "deepspeed --num_gpus 8 --module eviback warmup steps=3") in lines
    assert (11, "make world && python -m common.tinyworld build --out runs/w") in lines
    assert (3, "cer eval") in lines


def test_the_extraction_rules_on_a_sample(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(SAMPLE, encoding="utf-8")
    assert named_make_targets(page) == {"lint": 6, "world": 11}
    assert named_modules(page) == {"arco": 3, "cer": 6, "eviback": 8, "common.tinyworld": 11}
    # each dotted key with the config its command reads (`steps=3` has no section: not a key)
    keys = {(line, key, config) for line, key, config in assigned_keys(page)}
    assert keys == {(3, "rl.dense_steps", "arco"), (6, "reward.type", "cer")}
    assert table_keys(page) == [(15, "key", "assets.model"), (15, "key", "engine.*")]
    assert method_commands(page) == [
        (6, "cer", "train", ["--config"]),
        (8, "eviback", "warmup", []),
        (3, "arco", "train", ["--variant"]),
        (3, "cer", "eval", []),
    ]
    assert module_options(page) == [(11, "common.tinyworld", "--out")]
    # alone in a span: a key; `engine.*` and `hf://a.b=c` are not
    assert spanned_keys(page) == [(15, "assets.model"), (17, "reward.fn")]
    assert script_options(page) == [(19, "benchmarks/cost_model.py", "--cer-prompt-len")]


def test_keys_resolve_on_the_config_dataclasses():
    arco, cer = [config_class("arco")], [config_class("cer")]
    assert key_problem("rl.dense_steps", arco, assigned=True) is None
    assert key_problem("engine.*", arco, assigned=False) is None
    assert key_problem("reward.fn_args.function", cer, assigned=True) is None  # a mapping
    assert key_problem("rl.no_such_key", arco, assigned=True) == "no such key in ArcoConfig"
    assert (
        key_problem("train.lr", arco, assigned=True) == "derived by the trainer: refused when set"
    )
    assert key_problem("train.lr", arco, assigned=False) is None
    assert key_problem("assets.train_file", arco, assigned=True) == "renamed to ['assets.train']"


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_make_target_named_exists(path):
    targets = make_targets()
    missing = [
        f"{where(path, line)}: make {t}"
        for t, line in named_make_targets(path).items()
        if t not in targets
    ]
    assert not missing, "make targets the Makefile lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_python_module_named_exists(path):
    missing = [
        f"{where(path, line)}: python -m {name}"
        for name, line in named_modules(path).items()
        if not runnable(name)
    ]
    assert not missing, "modules that do not run:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_file_named_exists(path):
    missing = [
        f"{where(path, line)}: {p}"
        for p, line in named_paths(path).items()
        if not (ROOT / p).exists()
    ]
    assert not missing, "files that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_config_key_set_exists(path):
    """`section.key=value` in a command or a span: a key of the command's config (any trainer's
    outside a command), not a derived one."""
    bad = []
    for line, key, config in assigned_keys(path):
        classes = [config_class(config)] if config else all_config_classes()
        problem = key_problem(key, classes, assigned=True)
        if problem:
            bad.append(f"{where(path, line)}: {key}= ({problem})")
    assert not bad, "config keys that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_config_key_in_a_span_exists(path):
    """`rl.dense_steps` alone in a span: a key of some trainer's config (an old, renamed key
    is one: the configs refuse it by name)."""
    classes = all_config_classes()
    renamed = {old for c in classes for old in getattr(c, "RENAMED", {})}
    bad = [
        f"{where(path, line)}: {key} ({key_problem(key, classes, assigned=False)})"
        for line, key in spanned_keys(path)
        if key not in renamed and key_problem(key, classes, assigned=False)
    ]
    assert not bad, "config keys that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_config_key_in_a_table_exists(path):
    """A `key` or `new key` column: a key of some trainer's config; `old key`: a renamed one."""
    renamed = {old for c in all_config_classes() for old in getattr(c, "RENAMED", {})}
    bad = []
    for line, column, key in table_keys(path):
        if column == "old key":
            problem = None if key in renamed else "no config renames it"
        else:
            problem = key_problem(key, all_config_classes(), assigned=False)
        if problem:
            bad.append(f"{where(path, line)}: {key} ({problem})")
    assert not bad, "config keys in tables that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_method_command_exists(path):
    """`arco train --variant X`: the subcommand and each option are the method's parser's."""
    bad = []
    for line, method, sub, options in method_commands(path):
        if sub == "...":
            continue
        commands = subcommands(method_parser(method))
        if sub.startswith("-"):
            known = method_parser(method)._option_string_actions
            problem = None if sub in known else f"no option {sub}"
        elif sub not in commands:
            problem = f"no subcommand {sub!r} (has {', '.join(commands)})"
        else:
            unknown = [o for o in options if o not in commands[sub]._option_string_actions]
            problem = f"no option {', '.join(unknown)}" if unknown else None
        if problem:
            bad.append(f"{where(path, line)}: {method} {sub}: {problem}")
    assert not bad, "method commands that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_module_option_named_exists(path):
    """`python -m experiments.compare --spec F`: the option is written in the module's source."""
    bad = [
        f"{where(path, line)}: python -m {module} {option}"
        for line, module, option in module_options(path)
        if f'"{option}"' not in module_sources(module)
    ]
    assert not bad, "options the modules do not define:\n" + "\n".join(bad)


@pytest.mark.parametrize("path", DOCS, ids=ids(DOCS))
def test_every_script_option_named_exists(path):
    """`python benchmarks/bench_x.py --opt`: the option is written in the script (or a module
    beside it that it imports)."""
    bad = [
        f"{where(path, line)}: python {script} {option}"
        for line, script, option in script_options(path)
        if f'"{option}"' not in script_sources(script)
    ]
    assert not bad, "options the scripts do not define:\n" + "\n".join(bad)


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
