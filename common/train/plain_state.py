"""Resume state in plain formats: reading it never runs code.

A run folder may come from someone else, and a pickle (``torch.load(weights_only=False)``,
``pickle.load``) runs whatever code it names when it is read. So the state a run resumes from
(optimizer and schedule, random streams, ARCO's warmup phases) is written as

    <stem>.safetensors   every tensor (safetensors: a JSON header and raw bytes)
    <stem>.json          everything else, the tensors named by their key in the file above

``save_plain(stem, obj)`` writes them (the safetensors file first, the JSON last: the JSON names
a complete pair); ``load_plain(stem)`` reads them back, equal to ``obj`` value for value and type
for type: None, bool, int, float (NaN and inf too), str, list, tuple, dict (any keys of these
types), torch tensors (dtype, shape and values; on CPU), numpy arrays of numbers (the numpy
RNG's state) and the dataclasses and named tuples a caller names in ``classes`` (rebuilt from
their fields by their own constructor). numpy scalars are written as the Python number. Any
other object is a ``PlainStateError`` when saved; a file naming a class the caller did not name,
or holding anything but these, is a ``PlainStateError`` when loaded: nothing in the files picks
what code runs.

``load_legacy_torch`` reads a ``.pt`` file of an older checkpoint with ``weights_only=True``
(torch's restricted unpickler: tensors, containers, numbers and the numpy classes an RNG state
holds), and refuses any other pickle in one line (``PlainStateError``) without running it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.jsonl import replace_atomic, write_atomic

TAGS = ("__tuple__", "__dict__", "__tensor__", "__ndarray__", "__float__", "__object__")


class PlainStateError(ValueError):
    """State that is not plain data: refused when written or read, never run."""


def save_plain(stem: str | Path, obj: Any, classes: Iterable[type] = ()) -> None:
    """``obj`` into ``<stem>.json`` (+ ``<stem>.safetensors`` when it holds tensors)."""
    from safetensors.torch import save_file

    stem = Path(stem)
    known = _names(classes)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    tree = _encode(obj, tensors, seen, known, "")
    weights = stem.with_name(stem.name + ".safetensors")
    if tensors:
        replace_atomic(weights, lambda tmp: _save_tensors(save_file, tensors, tmp))
    else:
        weights.unlink(missing_ok=True)
    text = json.dumps({"format": "plain-state/1", "tensors": len(tensors), "value": tree})
    write_atomic(stem.with_name(stem.name + ".json"), text)


def load_plain(stem: str | Path, classes: Iterable[type] = ()) -> Any:
    """What ``save_plain(stem, obj, classes)`` wrote (``PlainStateError`` for anything else)."""
    from safetensors.torch import load_file

    stem = Path(stem)
    file = stem.with_name(stem.name + ".json")
    try:
        record = json.loads(file.read_text(encoding="utf-8"))
        value, count = record["value"], int(record["tensors"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise PlainStateError(f"{file}: unreadable state ({type(err).__name__}: {err})") from None
    tensors: dict[str, torch.Tensor] = {}
    if count:
        weights = stem.with_name(stem.name + ".safetensors")
        try:
            tensors = load_file(str(weights), device="cpu")
        except Exception as err:  # missing, truncated, or not a safetensors file
            raise PlainStateError(f"{weights}: unreadable tensors ({err})") from None
    try:
        return _decode(value, tensors, _names(classes))
    except PlainStateError as err:
        raise PlainStateError(f"{file}: {err}") from None


def exists(stem: str | Path) -> bool:
    """Whether ``save_plain(stem, ...)`` has written its state there (its JSON, written last)."""
    stem = Path(stem)
    return stem.with_name(stem.name + ".json").is_file()


def remove(stem: str | Path) -> None:
    """The files of ``save_plain(stem, ...)``, gone."""
    stem = Path(stem)
    for suffix in (".json", ".safetensors"):
        stem.with_name(stem.name + suffix).unlink(missing_ok=True)


# the numpy classes a pickled numpy RNG state needs (an older checkpoint's rng_rank<r>.pt);
# torch's restricted unpickler builds nothing else
_NUMPY_RNG_GLOBALS = [
    np._core.multiarray._reconstruct,
    np.ndarray,
    np.dtype,
    np.dtypes.UInt32DType,
]


def load_legacy_torch(file: str | Path, what: str) -> Any:
    """An older checkpoint's ``.pt`` file read with ``weights_only=True``; a pickle that names
    anything else (code that would run on loading) is refused in one line, not run."""
    file = Path(file)
    try:
        with torch.serialization.safe_globals(_NUMPY_RNG_GLOBALS):
            return torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PlainStateError(
            f"{file}: refused: not plain {what} (a pickle naming code that loading would run; "
            f"torch's weights_only loader says: {first[:200]}); it was not loaded. A folder from "
            "someone else can hold such a file: start the run again (resume=false), or load the "
            "checkpoint you trust with the version that wrote it and save it again"
        ) from None


def _names(classes: Iterable[type]) -> dict[str, type]:
    return {f"{c.__module__}.{c.__qualname__}": c for c in classes}


def _encode(x: Any, tensors: dict, seen: set[int], known: dict[str, type], where: str) -> Any:
    if x is None or isinstance(x, bool | int | str):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"__float__": repr(x)}
    if isinstance(x, np.generic) and isinstance(x.item(), bool | int | float):
        return _encode(x.item(), tensors, seen, known, where)
    if isinstance(x, torch.Tensor):
        t = x.detach().to("cpu").contiguous()
        if t.numel():  # safetensors refuses two tensors on one storage: the second a copy
            if t.untyped_storage().data_ptr() in seen:
                t = t.clone()
            seen.add(t.untyped_storage().data_ptr())
        key = str(len(tensors))
        tensors[key] = t
        return {"__tensor__": key}
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biuf":
            raise PlainStateError(f"{where or 'state'}: a numpy array of {x.dtype}: not plain")
        data = [_encode(v, tensors, seen, known, where) for v in x.ravel().tolist()]
        return {"__ndarray__": {"dtype": x.dtype.str, "shape": list(x.shape), "data": data}}
    name = f"{type(x).__module__}.{type(x).__qualname__}"
    if name in known and dataclasses.is_dataclass(x):
        fields = {
            f.name: _encode(getattr(x, f.name), tensors, seen, known, f"{where}.{f.name}")
            for f in dataclasses.fields(x)
        }
        return {"__object__": {"class": name, "fields": fields}}
    if name in known and isinstance(x, tuple) and hasattr(x, "_fields"):
        fields = {
            k: _encode(v, tensors, seen, known, f"{where}.{k}") for k, v in x._asdict().items()
        }
        return {"__object__": {"class": name, "fields": fields}}
    if type(x) is tuple:
        return {"__tuple__": [_encode(v, tensors, seen, known, where) for v in x]}
    if type(x) is list:
        return [_encode(v, tensors, seen, known, where) for v in x]
    if type(x) is dict:
        if all(isinstance(k, str) for k in x) and not (len(x) == 1 and next(iter(x)) in TAGS):
            return {k: _encode(v, tensors, seen, known, f"{where}.{k}") for k, v in x.items()}
        return {
            "__dict__": [
                [_encode(k, tensors, seen, known, where), _encode(v, tensors, seen, known, where)]
                for k, v in x.items()
            ]
        }
    raise PlainStateError(f"{where or 'state'}: a {name} is not plain state")


def _decode(x: Any, tensors: dict[str, torch.Tensor], known: dict[str, type]) -> Any:
    if x is None or isinstance(x, bool | int | float | str):
        return x
    if isinstance(x, list):
        return [_decode(v, tensors, known) for v in x]
    if not isinstance(x, dict):
        raise PlainStateError(f"a {type(x).__name__} in the JSON")
    if len(x) != 1 or next(iter(x)) not in TAGS:
        return {k: _decode(v, tensors, known) for k, v in x.items()}
    tag, body = next(iter(x.items()))
    if tag == "__tuple__" and isinstance(body, list):
        return tuple(_decode(v, tensors, known) for v in body)
    if tag == "__dict__" and isinstance(body, list):
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise PlainStateError("a __dict__ entry that is not a [key, value] pair")
            key = _decode(pair[0], tensors, known)
            if not isinstance(key, bool | int | float | str | tuple | type(None)):
                raise PlainStateError(f"a dict key of type {type(key).__name__}")
            out[key] = _decode(pair[1], tensors, known)
        return out
    if tag == "__tensor__" and isinstance(body, str):
        if body not in tensors:
            raise PlainStateError(f"tensor {body!r} is not in the safetensors file")
        return tensors[body]
    if tag == "__float__" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "__ndarray__" and isinstance(body, dict):
        dtype = np.dtype(str(body.get("dtype")))
        if dtype.kind not in "biuf":
            raise PlainStateError(f"a numpy array of {dtype}")
        data = [_decode(v, tensors, known) for v in body.get("data", [])]
        return np.array(data, dtype=dtype).reshape([int(n) for n in body.get("shape", [])])
    if tag == "__object__" and isinstance(body, dict):
        name, fields = body.get("class"), body.get("fields")
        if name not in known or not isinstance(fields, dict):
            raise PlainStateError(f"class {name!r} is not one this state may hold")
        cls = known[name]
        values = {k: _decode(v, tensors, known) for k, v in fields.items()}
        if dataclasses.is_dataclass(cls):
            init = {f.name for f in dataclasses.fields(cls) if f.init}
            obj = cls(**{k: v for k, v in values.items() if k in init})
            for k, v in values.items():
                if k not in init:
                    object.__setattr__(obj, k, v)
            return obj
        return cls(**values)
    raise PlainStateError(f"an unknown entry {tag!r}")


def _save_tensors(save_file, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """safetensors' ``save_file``; its I/O error (a ``SafetensorError``) raised as the
    ``OSError`` it is (ENOSPC for a full disk), as torch's and Python's writers raise theirs."""
    try:
        save_file(tensors, str(file))
    except Exception as err:
        if type(err).__name__ != "SafetensorError":
            raise
        text = str(err)
        full = "no space left" in text.lower() or "StorageFull" in text
        raise OSError(errno.ENOSPC if full else errno.EIO, f"writing {file}: {text}") from err
