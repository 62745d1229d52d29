"""Typed configs: YAML files into nested dataclasses, with dotted command-line overrides.

    cfg = load_config(RunConfig, "configs/tiny.yaml", ["train.lr=1e-6", "rollout.max_turns=4"])

A YAML file is a mapping of a dataclass's fields; a field whose type is a dataclass takes a nested
mapping. Field types: int, float, str, bool, Optional[X], list[X], dict[str, X], Literal[...] and
nested dataclasses. A float field also takes an int and a numeric string (YAML 1.1 reads ``1e-6``
as a string). Every field should carry its help text in ``field(metadata={"help": ...})``;
``describe_config`` lists them for a CLI's ``--help``.

Inheritance: a file whose top level holds ``defaults: base.yaml`` (a path relative to that file)
is laid over the base, which may itself name a base. Mappings merge key by key, so the child only
writes what it changes; lists and scalars replace. Overrides ``key.sub=value`` come last; the value
is read with ``yaml.safe_load`` (``true``, ``3``, ``[1, 2]``, ``null``). A mapping given as an
override replaces the one in the file (``files={a: x.jsonl}``); ``files.a=x.jsonl`` sets one entry.

Ranges: a number field's metadata may bound it, ``field(default=1, metadata={"help": ...,
"ge": 1})`` with ``ge`` / ``gt`` / ``le`` / ``lt`` (>=, >, <=, <); in a list, tuple or dict field
the bounds apply to every element. They are checked when the config is built, and
``describe_config`` shows them. Choices are ``Literal[...]`` types. Checks across fields belong in
the dataclass's ``__post_init__``, raising ``ValueError``.

Derived keys: a run config class may declare ``DERIVED``, a ``ClassVar`` mapping each dotted key
its trainer sets itself (``train.seed``, ``train.grad_accum``...) to what it derives it from
(``"seed"``). A derived key is not a setting: the command line and a config file that set one are
refused, naming the keys to set instead, and ``describe_config`` shows it as the trainer's. A run's
recorded settings (a file that writes the key's whole section, as ``dump_config`` and a run
folder's ``config.yaml`` do) load as they are: there the value records what the trainer derived.

Renamed keys: a run config class may declare ``RENAMED``, a ``ClassVar`` mapping each dotted key
of an earlier version to its new name (``train_file`` -> ``assets.train``); a file or an override
that still uses an old key fails naming the old key, where it was set and the new key.

Every mistake is a ``ConfigError`` naming the dotted key and where it came from (the file or the
command line): an unknown key (with the closest valid key), a wrong type (with the expected type
and the value), a value out of its range (with the range), a choice not among the choices, a
missing required field, a failed ``__post_init__`` check, a derived key.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from common.redact import redact_secrets

T = TypeVar("T")
COMMAND_LINE = "command line"
BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


class ConfigError(ValueError):
    """A config file or override that does not fit its dataclass."""


# A file name holds at most 255 bytes on the usual file systems: room for a suffix (".jsonl").
MAX_NAME_BYTES = 200


def path_name(value: Any, key: str) -> str:
    """``value``, a name a user gave (a benchmark of ``assets.eval``, an arm of a comparison),
    when it can be one file or folder name inside the folder it is joined to: text, not empty,
    not ``.`` or ``..``, no path separator (``/``, ``\\``), no control character, at most
    ``MAX_NAME_BYTES`` bytes. Else a ``ConfigError`` naming ``key`` and the value (``../../x``
    would write outside the run folder). Every such name goes through here before it is
    joined to a path."""
    why = ""
    if not isinstance(value, str):
        why = f"a name is text, not {type(value).__name__}"
    elif not value.strip():
        why = "it is empty"
    elif value in (".", ".."):
        why = "it names a folder, not a file in it"
    elif "/" in value or "\\" in value:
        why = "it holds a path separator"
    elif any(ord(c) < 32 or ord(c) == 127 for c in value):
        why = "it holds a control character"
    elif len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        why = f"over {MAX_NAME_BYTES} bytes"
    if why:
        raise ConfigError(
            f"{key}: {value!r:.80} cannot be a file or folder name ({why}); "
            "name it with letters, digits, '.', '_' and '-'"
        )
    return value


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: typing.Sequence[str] = ()
) -> T:
    """Build ``cls`` from the YAML file at ``path`` (and its ``defaults`` chain), then ``overrides``."""
    sources: dict[str, str] = {}
    files: dict[str, dict[str, Any]] = {}  # each file's own mapping, for _refuse_derived
    data = _read_yaml(Path(path), sources, (), files) if path is not None else {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"override {item!r} on the {COMMAND_LINE} is not of the form key.sub=value"
            )
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(
                f"override {item!r} on the {COMMAND_LINE}: bad YAML value: {e}"
            ) from None
        data = _override(data, key.strip().split("."), value, sources)
    ctx = _Context(cls, sources)
    _refuse_derived(cls, data, ctx, files)
    return _convert(cls, data, "", ctx)


def derived_keys(cls: type) -> dict[str, str]:
    """Dotted key -> what the trainer of ``cls`` derives it from (the class's ``DERIVED``)."""
    return dict(getattr(cls, "DERIVED", {}))


def renamed_keys(cls: type) -> dict[str, str]:
    """Old dotted key -> its new name (the class's ``RENAMED``): an old key is refused naming both."""
    return dict(getattr(cls, "RENAMED", {}))


def _refuse_derived(
    cls: type, data: dict[str, Any], ctx: _Context, files: dict[str, dict[str, Any]]
) -> None:
    """A ConfigError for a derived key set on the command line or in a config file that is not a
    run's recorded settings (one writing the key's whole section)."""
    valid = {k for k, *_ in _leaves(cls, "")}
    for key, source in derived_keys(cls).items():
        parts = key.split(".")
        if not _holds(data, parts):
            continue
        origin = ctx.source(key)
        if origin in files and _whole_section(cls, files[origin], parts[:-1]):
            continue
        instead = [k for k in re.findall(r"[A-Za-z_][\w.]*", source) if k in valid]
        raise ConfigError(
            f"config key {key!r} (from {ctx.where(key)}) is derived by the trainer "
            f"({key} = {source}); set {', '.join(instead) or 'those keys'} instead"
        )


def _holds(data: Any, parts: list[str]) -> bool:
    """Whether the nested mapping ``data`` has the dotted key ``parts``."""
    for part in parts:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _whole_section(cls: type, data: dict[str, Any], parts: list[str]) -> bool:
    """Whether ``data`` (one file's mapping) sets every field of the section ``parts`` of ``cls``."""
    for part in parts:
        hints = typing.get_type_hints(cls)
        if part not in hints or not dataclasses.is_dataclass(hints[part]):
            return False
        cls, data = hints[part], data.get(part) if isinstance(data, dict) else None
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return isinstance(data, dict) and names <= set(data)


def _override(
    data: dict[str, Any], parts: list[str], value: Any, sources: dict[str, str]
) -> dict[str, Any]:
    """Set the dotted key ``parts`` to ``value``. Unlike a file's keys, a mapping given on the
    command line replaces the mapping there (``k={a: 1}``); ``k.a=1`` changes one entry."""
    out = dict(data)
    node = out
    for part in parts[:-1]:
        child = node.get(part)
        node[part] = dict(child) if isinstance(child, dict) else {}
        node = node[part]
    node[parts[-1]] = value
    key = ".".join(parts)
    for stale in [k for k in sources if k == key or k.startswith(key + ".")]:
        del sources[stale]
    _merge({}, {parts[-1]: value}, COMMAND_LINE, sources, key[: -len(parts[-1])])
    return out


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain dicts, lists and scalars (what ``dump_config`` writes)."""
    return _plain(dataclasses.asdict(cfg))


def _plain(value: Any) -> Any:
    """Tuples become lists: YAML's safe dumper has no tuple, and loading converts them back."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def dump_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML; ``load_config`` on it gives an equal object, except
    that credentials inside URLs are masked (``common.redact``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(redact_secrets(config_to_dict(cfg)), sort_keys=False)
    Path(path).write_text(text, encoding="utf-8")


def describe_config(cls: type) -> str:
    """One line per dotted key: ``key  type  range  default  help`` (for a CLI's --help)."""
    derived = {k: f"set by the trainer: {k} = {v}" for k, v in derived_keys(cls).items()}
    rows = [
        (k, _type_name(t), range_text(f), d, derived.get(k, f.metadata.get("help", "")))
        for k, t, f, d in _leaves(cls, "")
    ]
    # a long type (a Literal of many choices) overflows its own row instead of widening them all
    caps = (48, 32, 12, 24)
    widths = [min(max((len(r[i]) for r in rows), default=0), caps[i]) for i in range(4)]
    return "\n".join(
        ("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]).rstrip()
        for r in rows
    )


def range_text(f: dataclasses.Field) -> str:
    """A field's bounds as text: ``>= 1``, ``> 0``, ``[0, 1]``, ``(0, 1]``; ``""`` when unbounded."""
    lower = [(k, f.metadata[k]) for k in ("ge", "gt") if k in f.metadata]
    upper = [(k, f.metadata[k]) for k in ("le", "lt") if k in f.metadata]
    if lower and upper:
        (lk, lo), (uk, hi) = lower[0], upper[0]
        return f"{'[' if lk == 'ge' else '('}{lo}, {hi}{']' if uk == 'le' else ')'}"
    return " ".join(f"{BOUNDS[k]} {v}" for k, v in lower + upper)


def _in_range(f: dataclasses.Field, value: float) -> bool:
    m = f.metadata
    return (
        ("ge" not in m or value >= m["ge"])
        and ("gt" not in m or value > m["gt"])
        and ("le" not in m or value <= m["le"])
        and ("lt" not in m or value < m["lt"])
    )


def _check_range(f: dataclasses.Field, value: Any, key: str, ctx: _Context) -> None:
    """Raise a ConfigError when ``value`` (or an element of it) is outside the field's bounds."""
    if not any(k in f.metadata for k in BOUNDS):
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_range(f, v, f"{key}.{k}", ctx)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _check_range(f, v, f"{key}[{i}]", ctx)
    elif isinstance(value, int | float) and not isinstance(value, bool) and not _in_range(f, value):
        raise ConfigError(
            f"config key {key!r} (from {ctx.where(key)}): {value!r} is out of range; "
            f"allowed: {range_text(f)}"
        )


def _read_yaml(
    path: Path,
    sources: dict[str, str],
    chain: tuple[Path, ...],
    files: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load one file over its ``defaults`` base, recording which file set each dotted key (and
    in ``files`` each file's own mapping)."""
    if path.resolve() in chain:
        loop = " -> ".join(map(str, (*chain, path.resolve())))
        raise ConfigError(f"config {path}: the 'defaults' chain loops: {loop}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    base: dict[str, Any] = {}
    if "defaults" in data:
        parent = data.pop("defaults")
        if not isinstance(parent, str):
            raise ConfigError(f"config file {path}: 'defaults' must be a file name, got {parent!r}")
        base = _read_yaml(path.parent / parent, sources, (*chain, path.resolve()), files)
    if files is not None:
        files[str(path)] = data
    return _merge(base, data, str(path), sources)


def _merge(
    base: dict[str, Any],
    new: dict[str, Any],
    source: str,
    sources: dict[str, str],
    prefix: str = "",
) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, source, sources, key + ".")
        else:
            out[k] = v
            sources[key] = source
    return out


@dataclasses.dataclass
class _Context:
    root: type
    sources: dict[str, str]

    def where(self, key: str) -> str:
        """The file (or the command line) that set ``key`` or its closest enclosing section."""
        source = self.source(key)
        return self._name(source) if source else "defaults"

    def source(self, key: str) -> str | None:
        """``where`` as recorded: a file's path, ``COMMAND_LINE``, or None (the defaults)."""
        parts = key.split(".")
        for n in range(len(parts), 0, -1):
            source = self.sources.get(".".join(parts[:n]).split("[")[0])
            if source:
                return source
        # a section that only its own keys set (``trian.lr=1`` sets ``trian.lr``, not ``trian``)
        below = [s for k, s in self.sources.items() if k.startswith(key.split("[")[0] + ".")]
        return below[-1] if below else None

    def where_section(self, key: str) -> str:
        """Every source that set a key of section ``key`` ("" = all): a check across its keys
        may be failed by any of them."""
        found = {s for k, s in self.sources.items() if not key or k.startswith(key + ".")}
        names = [self._name(s) for s in sorted(found - {COMMAND_LINE})]
        names += [self._name(COMMAND_LINE)] if COMMAND_LINE in found else []
        return " and ".join(names) or "defaults"

    @staticmethod
    def _name(source: str) -> str:
        return f"the {source}" if source == COMMAND_LINE else f"file {source}"

    def unknown(self, key: str) -> ConfigError:
        new = renamed_keys(self.root).get(key)
        if new:
            return ConfigError(
                f"config key {key!r} (from {self.where(key)}) was renamed: use {new!r} "
                "(docs/configuration.md)"
            )
        valid = [k for k, *_ in _leaves(self.root, "")]
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        if not close:  # a right name in the wrong section: match on the last component
            leaves = {k.rsplit(".", 1)[-1]: k for k in reversed(valid)}
            close = [
                leaves[m] for m in difflib.get_close_matches(key.rsplit(".", 1)[-1], leaves, 1)
            ]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return ConfigError(f"unknown config key {key!r} (from {self.where(key)}){hint}")

    def wrong(self, key: str, tp: Any, value: Any, why: str = "") -> ConfigError:
        return ConfigError(
            f"config key {key!r} (from {self.where(key)}): expected {_type_name(tp)}, "
            f"got {value!r} ({type(value).__name__}){why}"
        )


def _convert(tp: Any, value: Any, key: str, ctx: _Context) -> Any:
    """``value`` (from YAML) as an instance of type ``tp``, or a ConfigError about ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, ctx)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, key, ctx)
            except ConfigError:
                continue
        raise ctx.wrong(key, tp, value)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise ctx.wrong(key, tp, value, f"; choices: {', '.join(map(repr, args))}")
    if origin is list:
        if not isinstance(value, list):
            raise ctx.wrong(key, tp, value)
        return [_convert(args[0], v, f"{key}[{i}]", ctx) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ctx.wrong(key, tp, value)
        types_ = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(value) != len(types_):
            raise ctx.wrong(key, tp, value)
        pairs = enumerate(zip(types_, value, strict=True))
        return tuple(_convert(t, v, f"{key}[{i}]", ctx) for i, (t, v) in pairs)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ctx.wrong(key, tp, value)
        return {k: _convert(args[1], v, f"{key}.{k}", ctx) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ctx.wrong(key, tp, value) from None
    if (
        tp in (int, str, bool)
        and isinstance(value, tp)
        and not (tp is int and isinstance(value, bool))
    ):
        return value
    if tp in (int, float, str, bool):
        raise ctx.wrong(key, tp, value)
    raise ConfigError(f"config key {key!r}: field type {_type_name(tp)} is not supported")


def _build(cls: type, value: Any, key: str, ctx: _Context) -> Any:
    """Instantiate dataclass ``cls`` from a mapping; absent fields take their defaults."""
    if not isinstance(value, dict):
        raise ctx.wrong(key or "<top level>", cls, value, "; expected a mapping of its fields")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for name in value:
        if name not in fields:
            raise ctx.unknown(f"{key}.{name}" if key else str(name))
    kwargs = {}
    for name, f in fields.items():
        sub = f"{key}.{name}" if key else name
        default = _default(f)
        if name in value:
            v = value[name]
            if dataclasses.is_dataclass(default) and isinstance(v, dict):
                v = _merge(config_to_dict(default), v, "", {})  # partial section over its default
            kwargs[name] = _convert(hints[name], v, sub, ctx)
            _check_range(f, kwargs[name], sub, ctx)
        elif default is dataclasses.MISSING and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _build(hints[name], {}, sub, ctx)
        elif default is dataclasses.MISSING:
            raise ConfigError(f"config key {sub!r} is required (it has no default) and was not set")
    try:
        return cls(**kwargs)
    except ValueError as e:  # a __post_init__ check
        raise ConfigError(
            f"config section {key or '<top level>'!r} (from {ctx.where_section(key)}): {e}"
        ) from None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _leaves(
    cls: type, prefix: str, defaults: Any = None
) -> list[tuple[str, Any, dataclasses.Field, str]]:
    """(dotted key, type, field, default as text) for every non-dataclass field, depth first.

    A section's defaults come from its field's default instance when it has one.
    """
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, d = hints[f.name], _default(f) if defaults is None else getattr(defaults, f.name)
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, f"{prefix}{f.name}.", d if dataclasses.is_dataclass(d) else None)
        else:
            out.append(
                (prefix + f.name, tp, f, "required" if d is dataclasses.MISSING else repr(d))
            )
    return out


def _type_name(tp: Any) -> str:
    plain = isinstance(tp, type) and typing.get_origin(tp) is None
    return tp.__name__ if plain else str(tp).replace("typing.", "")


def module_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The argument parser of ``python -m <module>``: its docstring as the description, kept as
    written (examples and tables in it stay laid out)."""
    return argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
