"""What a user installing the package checks: a wheel and an sdist that `twine check` passes,
metadata that names the license, version and project URLs, types that ship (`py.typed`), and
a `tether` that works from a fresh virtual environment with nothing of this checkout in it."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tether

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ("__pycache__", "*.egg-info", "*.pyc")


def run(*argv: str | Path, cwd: Path | None = None, **env: str) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env},
    )
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # built from a copy of what the sdist takes: a build writes its scratch (egg-info, the
    # sdist's folder) beside the source, where another build of this checkout (a second
    # suite) would take it away mid-way
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns(*SCRATCH))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    # the build backend is this environment's (the dev extra has it): an isolated one for
    # each of the sdist and the wheel cost 10 s of the test
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source)
    wheel = next(dist.glob("tether_runtime-*.whl"))
    sdist = next(dist.glob("tether_runtime-*.tar.gz"))
    assert "PASSED" in run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    assert "tether/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Name"] == "tether-runtime" and meta["Version"] == tether.__version__
    assert meta["License-Expression"] == "MIT"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Changelog"} <= set(urls)

    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    run(base, "-m", "venv", "--without-pip", venv)  # this pip installs into it: 4 s less
    pip = (sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q")
    run(*pip, "--no-compile", "--disable-pip-version-check", wheel)
    assert run(venv / "bin" / "tether", "--version").strip() == f"tether {tether.__version__}"
    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    examples = ROOT / "examples"
    out = run(
        venv / "bin" / "tether", "run", "What is the weather in Oslo and Lisbon?",
        "--provider", "scripted", "--script", examples / "weather_script.json",
        "--tools-from", examples / "tools.py",
        cwd=work, HOME=str(home), XDG_DATA_HOME=str(home / "data"),
    )  # fmt: skip
    assert "Oslo is 3 °C" in out
    # the installed package, not this checkout's source, answered
    where = run(venv / "bin" / "python", "-c", "import tether; print(tether.__file__)", cwd=work)
    assert where.startswith(str(venv))
    assert (home / "data" / "tether" / "runs.sqlite").exists()  # durable by default


def test_no_install_hint_names_a_distribution_that_is_not_ours() -> None:
    """The distribution is `tether-runtime`: a hint to `pip install 'tether[mcp]'` installed
    someone else's package, or nothing."""
    import re

    root = Path(__file__).resolve().parent.parent
    pages = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "src").rglob("*.py")]
    wrong = [
        f"{p.relative_to(root)}: {m.group()}"
        for p in pages
        for m in re.finditer(r"(?<![\w-])tether\[\w+", p.read_text())
    ]
    assert wrong == []
