"""The small wheelhouse a bare GPU node needs for ``make gpu-check-bare``.

A cluster node or container with its own torch (CUDA), transformers and peft, no vLLM, no
DeepSpeed and no network: DeepSpeed and the few pure-Python or small packages it imports are
carried to it in one folder of wheels, built here on a connected machine::

    python scripts/wheelhouse.py build [--out wheelhouse] [--python 3.12 --python 3.11]
    python3 scripts/wheelhouse.py install [--wheelhouse wheelhouse] [--target runs/bare-deps]

``build`` downloads (``pip download``, binary wheels for the node's Python versions and
manylinux x86_64) and builds DeepSpeed's own pure-Python wheel from its sdist; it writes
``manifest.json`` (each distribution, the module it provides, its files and bytes) and stops
when the folder passes ``--max-mib`` (50). ``install`` runs on the node with its own ``python3``
and no index: it installs, into ``--target``, only the distributions whose module the node
cannot import already (so the node's own numpy, packaging, tqdm... are never shadowed) and
prints the ``PYTHONPATH`` to use. Nothing else of the project is installed: the check runs from
the project tree.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEEPSPEED = "deepspeed==0.19.8"  # pyproject.toml's pin: the version the checks ran with
# DeepSpeed 0.19.8's requirements (its requirements/requirements.txt) and what pydantic needs;
# distribution -> the module that shows it is importable. torch is the node's own.
PACKAGES: dict[str, str] = {
    "hjson": "hjson",
    "msgpack": "msgpack",
    "ninja": "ninja",
    "numpy": "numpy",
    "packaging": "packaging",
    "psutil": "psutil",
    "py-cpuinfo": "cpuinfo",
    "pydantic": "pydantic",
    "pydantic-core": "pydantic_core",
    "annotated-types": "annotated_types",
    "typing-inspection": "typing_inspection",
    "typing-extensions": "typing_extensions",
    "einops": "einops",
    "nvidia-ml-py": "pynvml",
    "tqdm": "tqdm",
    "pyyaml": "yaml",
}
# numpy is large (about 16 MiB a Python version) and every torch image has it: left out unless
# asked for (--with-numpy)
LARGE = {"numpy"}
MAX_MIB = 50.0


def _pip(*args: str, python: str = sys.executable) -> None:
    cmd = [python, "-m", "pip", *args, "--disable-pip-version-check", "-q"]
    print("[wheelhouse] " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def folder_mib(folder: Path) -> float:
    """The size of the wheels in ``folder``, MiB."""
    return sum(f.stat().st_size for f in folder.glob("*.whl")) / 2**20


def build(out: Path, pythons: list[str], with_numpy: bool, max_mib: float) -> int:
    """Download the wheels for ``pythons`` and build DeepSpeed's; write ``manifest.json``."""
    out.mkdir(parents=True, exist_ok=True)
    wanted = [p for p in PACKAGES if with_numpy or p not in LARGE]
    for version in pythons:
        abi = "cp" + version.replace(".", "")
        _pip(
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(out),
            "--python-version",
            version,
            "--implementation",
            "cp",
            "--abi",
            abi,
            "--abi",
            "abi3",
            "--abi",
            "none",
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux_2_28_x86_64",
            "--platform",
            "any",
            *wanted,
        )
    with tempfile.TemporaryDirectory() as tmp:
        # DeepSpeed ships an sdist only; with DS_BUILD_OPS=0 it builds a pure-Python wheel that
        # compiles its ops just in time where they are used (the check uses none)
        env = {**os.environ, "DS_BUILD_OPS": "0"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp, DEEPSPEED]
        print("[wheelhouse] " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
        for wheel in Path(tmp).glob("*.whl"):
            shutil.copy2(wheel, out / wheel.name)
    files = sorted(f.name for f in out.glob("*.whl"))
    manifest = {
        "deepspeed": DEEPSPEED,
        "pythons": pythons,
        "packages": {"deepspeed": "deepspeed", **{p: PACKAGES[p] for p in wanted}},
        "files": files,
        "mib": round(folder_mib(out), 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"[wheelhouse] {len(files)} wheels, {manifest['mib']} MiB in {out}")
    if manifest["mib"] > max_mib:
        print(f"[wheelhouse] over the {max_mib:g} MiB limit", file=sys.stderr)
        return 1
    return 0


def missing(packages: dict[str, str]) -> list[str]:
    """The distributions of ``packages`` (name -> module) whose module this Python cannot import."""
    importlib.invalidate_caches()  # a folder of sys.path may have gained packages since
    return [name for name, module in packages.items() if importlib.util.find_spec(module) is None]


def install(wheelhouse: Path, target: Path) -> int:
    """Install, with no index, what this Python lacks of the wheelhouse into ``target``."""
    manifest_file = wheelhouse / "manifest.json"
    if not manifest_file.is_file():
        print(
            f"[wheelhouse] {manifest_file} not found: build the wheelhouse on a connected machine "
            "(python scripts/wheelhouse.py build) and copy the folder here",
            file=sys.stderr,
        )
        return 2
    packages = json.loads(manifest_file.read_text(encoding="utf-8"))["packages"]
    if str(target) not in sys.path:  # what an earlier install put there counts as present
        sys.path.insert(0, str(target))
    need = missing(packages)
    if need:
        _pip(
            "install",
            "--no-index",
            "--no-deps",
            "--find-links",
            str(wheelhouse),
            "--target",
            str(target),
            "--upgrade",
            *need,
        )
    print(f"[wheelhouse] installed {need or 'nothing'}; run with PYTHONPATH={target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/wheelhouse.py", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download and build the wheels (a connected machine)")
    b.add_argument("--out", default=str(ROOT / "wheelhouse"))
    b.add_argument(
        "--python",
        action="append",
        help="the node's Python version(s), e.g. 3.12 (default: 3.12 and this Python's)",
    )
    b.add_argument("--with-numpy", action="store_true", help="numpy too (about 16 MiB each)")
    b.add_argument("--max-mib", type=float, default=MAX_MIB)
    i = sub.add_parser("install", help="install what the node lacks (no index, no network)")
    i.add_argument("--wheelhouse", default=str(ROOT / "wheelhouse"))
    i.add_argument("--target", default=str(ROOT / "runs" / "bare-deps"))
    args = p.parse_args(argv)
    if args.command == "build":
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        pythons = args.python or sorted({"3.12", here})
        return build(Path(args.out), pythons, args.with_numpy, args.max_mib)
    return install(Path(args.wheelhouse), Path(args.target))


if __name__ == "__main__":
    sys.exit(main())
