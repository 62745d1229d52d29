"""What a run over several nodes needs that one node never shows: one run folder every rank sees,
service URLs every rank can reach, and the environment each node's ranks start with.

* ``check_placement(run_dir, urls)`` (every rank, before any model loads; ``Run`` calls it):
  rank 0 writes a random token into ``run_dir``, every rank reads it back, and the ranks'
  host names are gathered. A rank that cannot read the token stops every rank: its node does
  not mount ``run_dir`` (each node would resume from its own checkpoints, or from none). With
  ranks on more than one host, a loopback service URL (``127.0.0.1``, ``localhost``, ``::1``)
  stops the run: the ranks on other nodes would each reach their own loopback, not the server.
* ``deepspeed_env(environ)``: the lines of ``.deepspeed_env``, the file the DeepSpeed launcher
  reads from the working directory and exports on every node it starts ranks on (Hugging Face
  cache and offline flags, vLLM's settings, the teacher's API keys, the socket interfaces).
  ``python -m common.multinode deepspeed-env`` writes it (owner-only: it holds keys);
  ``make train-* HOSTFILE=...`` does so before launching.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import sys
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from common.config import ConfigError

ENV_FILE = ".deepspeed_env"
# forwarded when set: by exact name, by prefix, and every *_API_KEY (the teachers' keys)
FORWARD_NAMES = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_DATASETS_CACHE",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_TOKEN",
    "TRANSFORMERS_OFFLINE",
    "TRANSFORMERS_CACHE",
    "GLOO_SOCKET_IFNAME",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "CUDA_HOME",
)
FORWARD_PREFIXES = ("VLLM_", "NCCL_")
FORWARD_SUFFIXES = ("_API_KEY",)
# what DeepSpeed's launcher writes into an `export K="V"` line unharmed (it quotes, never escapes)
_SAFE_VALUE = re.compile(r'[^"$`\\\n]*')


def service_urls(cfg: Any) -> dict[str, str]:
    """The config's service URLs by dotted key: ``assets`` fields named ``*_url`` or
    ``*_endpoint`` that are set (``assets.retrieval_url``, ``assets.teacher_endpoint``, ...)."""
    assets = getattr(cfg, "assets", None)
    if assets is None or not is_dataclass(assets):
        return {}
    out = {}
    for f in fields(assets):
        value = getattr(assets, f.name)
        if f.name.endswith(("_url", "_endpoint")) and isinstance(value, str) and value:
            out[f"assets.{f.name}"] = value
    return out


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine only (localhost, 127.0.0.0/8, ::1)."""
    from urllib.parse import urlsplit

    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def placement_errors(
    run_dir: Path, seen: list[tuple[str, bool]], urls: Mapping[str, str]
) -> list[str]:
    """What is wrong with a run whose rank r is on host ``seen[r][0]`` and did (``seen[r][1]``)
    or did not read rank 0's token in ``run_dir``; empty when nothing is."""
    errors = []
    hosts = list(dict.fromkeys(host for host, _ in seen))
    blind = [rank for rank, (_, ok) in enumerate(seen) if not ok]
    if blind:
        where = sorted({seen[r][0] for r in blind})
        errors.append(
            f"run_dir {run_dir} is not one folder on every node: rank(s) {_ranges(blind)} "
            f"(on {', '.join(where)}) do not see the file rank 0 (on {seen[0][0]}) wrote there; "
            "put run_dir on a filesystem every node mounts at the same path (NFS, Lustre)"
        )
    if len(hosts) > 1:
        for key, url in urls.items():
            if is_loopback(url):
                errors.append(
                    f"{key}={url} is a loopback address and the run's {len(seen)} ranks are on "
                    f"{len(hosts)} nodes ({', '.join(hosts)}): the other nodes cannot reach it; "
                    "give the server's routable address (start it with --host 0.0.0.0)"
                )
    return errors


def check_placement(run_dir: str | Path, urls: Mapping[str, str], host: str | None = None) -> None:
    """Every rank: stop with a ``ConfigError`` (the same on every rank) when ``run_dir`` is not
    one shared folder or a service URL is loopback with ranks on several hosts. One process, or
    no process group: nothing to check. ``host``: this rank's host name (default: its own)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    run_dir = Path(run_dir)
    rank, world = dist.get_rank(), dist.get_world_size()
    token = [uuid.uuid4().hex if rank == 0 else ""]
    marker = run_dir / f".placement-{token[0]}"
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(token[0])
    dist.broadcast_object_list(token, src=0)
    marker = run_dir / f".placement-{token[0]}"
    try:
        ok = marker.read_text() == token[0]
    except OSError:
        ok = False
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, (host or socket.gethostname(), ok))
    if rank == 0:  # every rank has read it: the gather waited for them
        marker.unlink(missing_ok=True)
    errors = placement_errors(run_dir, [tuple(s) for s in seen], urls)
    if errors:
        raise ConfigError("; ".join(errors))


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start, prev = [], ranks[0], ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ", ".join(out)


def forwarded(name: str) -> bool:
    return (
        name in FORWARD_NAMES
        or name.startswith(FORWARD_PREFIXES)
        or name.endswith(FORWARD_SUFFIXES)
    )


def deepspeed_env(environ: Mapping[str, str], also: Iterable[str] = ()) -> list[str]:
    """``.deepspeed_env``'s lines (``NAME=value``, sorted) for the variables of ``environ`` a
    rank on another node needs (``forwarded``) plus the names in ``also``; a value DeepSpeed's
    launcher cannot pass through its ``export NAME="value"`` (a quote, ``$``, a backquote, a
    backslash, a newline) is a ``ConfigError`` that names the variable."""
    extra = set(also)
    lines = []
    for name in sorted(environ):
        if not (forwarded(name) or name in extra):
            continue
        value = environ[name]
        if not _SAFE_VALUE.fullmatch(value):
            raise ConfigError(
                f"{name}: its value holds a quote, $, backquote, backslash or newline, which "
                f"DeepSpeed's launcher cannot pass to other nodes; set it in {ENV_FILE} by hand"
            )
        lines.append(f"{name}={value}")
    missing = sorted(extra - set(environ))
    if missing:
        raise ConfigError(f"not set in this shell: {', '.join(missing)} (named with --also)")
    return lines


def write_deepspeed_env(path: str | Path, lines: list[str]) -> Path:
    """Write ``lines`` to ``path``, readable by its owner only (it holds keys)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.multinode", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("deepspeed-env", help=f"write {ENV_FILE} for a multi-node launch")
    env.add_argument("--out", default=ENV_FILE, help=f"file to write (default ./{ENV_FILE})")
    env.add_argument("--also", nargs="*", default=[], help="more variable names to forward")
    args = parser.parse_args(argv)
    try:
        lines = deepspeed_env(os.environ, args.also)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = write_deepspeed_env(args.out, lines)
    names = ", ".join(line.split("=", 1)[0] for line in lines) or "nothing"
    print(f"{path}: forwards {names} to every node (mode 600)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
