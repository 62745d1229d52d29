"""The console scripts `arco`, `cer` and `eviback`: declared in pyproject.toml, each the `run` of
its package's cli (`main` through `exit_process`, as `python -m` runs it); `main` prints a usage
line naming the command as the user typed it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("arco", "cer", "eviback")


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_package_has_a_console_script():
    scripts = _scripts()
    assert {n: scripts.get(n) for n in NAMES} == {n: f"{n}.cli:run" for n in NAMES}
    for n in NAMES:
        assert (ROOT / n / "__main__.py").read_text() == f"from {n}.cli import run\n\nrun()\n"


@pytest.mark.parametrize("name", NAMES)
def test_usage_names_the_command(name, capsys):
    main = importlib.import_module(f"{name}.cli").main
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {name} [-h] {{")
    description = out.split("\n\n")[1]
    assert description.startswith({"arco": "ARCO: ", "cer": "CER: ", "eviback": "EviBack: "}[name])
    assert "``" not in out.split("positional arguments")[0]  # no reST markup in the header


@pytest.mark.slow
def test_installed_script_and_python_m_agree():
    """The installed `eviback` (pip install -e .) and `python -m eviback` print the same help."""
    script = Path(sys.executable).parent / "eviback"
    if not script.is_file():
        pytest.skip("the project is not pip-installed in this environment")
    a = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    b = subprocess.run([sys.executable, "-m", "eviback", "--help"], capture_output=True,
                       text=True, check=True, cwd=ROOT)  # fmt: skip
    assert a.stdout == b.stdout and a.stdout.startswith("usage: eviback ")
