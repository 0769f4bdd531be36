"""The install a newcomer types (#37): the built wheel in a fresh venv without torch.

ddptop is not on the package index; docs/install.md tells users to install it from a
clone or from the wheel `make dist` builds. This test does what a login node does with that
wheel: it builds the sdist and, from the sdist, the wheel (`python -m build`, as `make dist`,
on a copy of the checkout so nothing is written into it), makes a plain venv from the base
interpreter (not .venv: no torch), installs the wheel there with pip (its dependencies from
the index or pip's cache), checks torch is absent, and runs the three commands a new user
tries first: `ddptop --version`, `ddptop doctor` on the kept real NCCL dumps, `ddptop jobs`.
Skips only where the index cannot be reached (pip finds neither the build backend nor a
dependency).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest

from ddptop.errors import FindingsPresent

ROOT = Path(__file__).resolve().parents[1]
NCCL_H100 = ROOT / "tests" / "data" / "nccl_h100"
# What pip says when the index cannot be reached or has no such package.
OFFLINE = ("Could not find a version that satisfies", "No matching distribution found",
           "Failed to establish a new connection", "Temporary failure in name resolution",
           "Network is unreachable", "Max retries exceeded")
NOT_COPIED = shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", "dist", "build",
                                    ".mypy_cache", ".ruff_cache", ".pytest_cache", ".mutation", "out")


def _version() -> str:
    """The one version: the literal ddptop/_version.py assigns (read as setuptools reads it)."""
    tree = ast.parse((ROOT / "ddptop" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__":
            assert isinstance(node.value, ast.Constant)
            return str(node.value.value)
    raise AssertionError("ddptop/_version.py assigns no __version__")


def _run(argv: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env,
                          cwd=cwd)


def _skip_if_offline(what: str, res: subprocess.CompletedProcess[str]) -> None:
    out = res.stdout + res.stderr
    if res.returncode != 0 and any(s in out for s in OFFLINE):
        pytest.skip(f"{what} needs the package index, which pip could not reach here: "
                    f"{out.strip().splitlines()[-1]}")


def _build(src: Path, dist: Path) -> Path:
    """sdist, then the wheel from it; with .venv's setuptools where it is new enough (no download)."""
    try:
        local_backend = int(metadata.version("setuptools").split(".")[0]) >= 77
    except metadata.PackageNotFoundError:
        local_backend = False
    if find_spec("build") is not None:
        argv = [sys.executable, "-m", "build", "--outdir", str(dist), str(src)]
        argv += ["--no-isolation"] if local_backend else []
    else:  # `build` is in the test extra; without it, the wheel alone (no sdist checked)
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)]
        argv += ["--no-build-isolation"] if local_backend else []
    res = _run(argv, timeout=300)
    _skip_if_offline("building the wheel (its build backend)", res)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    wheels = list(dist.glob("ddptop-*.whl"))
    assert len(wheels) == 1, list(dist.iterdir())
    return wheels[0]


@pytest.mark.slow
@pytest.mark.timeout(900)  # every subprocess below is bounded; a cold pip cache downloads ~20 MB
def test_the_wheel_installs_and_runs_in_a_fresh_venv_without_torch(tmp_path: Path) -> None:
    version = _version()
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED)
    wheel = _build(src, tmp_path / "dist")
    assert wheel.name.startswith(f"ddptop-{version}-"), wheel.name

    # Data files the dashboard and the launcher load at run time are in the wheel.
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = {p.relative_to(src).as_posix() for p in (src / "ddptop").rglob("*.tcss")}
    wanted |= {p.relative_to(src).as_posix() for p in (src / "ddptop" / "_inject").glob("*.py")}
    assert wanted and "ddptop/_inject/sitecustomize.py" in wanted, wanted
    assert wanted <= names, sorted(wanted - names)
    if find_spec("build") is not None:
        sdists = list((tmp_path / "dist").glob(f"ddptop-{version}.tar.gz"))
        assert len(sdists) == 1, list((tmp_path / "dist").iterdir())

    # A plain venv of the base interpreter: no torch, no .venv, no user site.
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    venv = tmp_path / "venv"
    res = _run([str(base), "-m", "venv", str(venv)], timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    py, ddptop = venv / "bin" / "python", venv / "bin" / "ddptop"
    res = _run([str(py), "-m", "pip", "install", "--disable-pip-version-check", str(wheel)],
               timeout=600, env=env)
    _skip_if_offline("installing the wheel's dependencies", res)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = _run([str(py), "-c", "import torch"], timeout=60, env=env)
    assert res.returncode != 0 and "No module named 'torch'" in res.stderr, (res.returncode, res.stderr)

    # What the user runs: from a folder of their own, with a home and runtime dir of their own.
    home, rt = tmp_path / "home", tmp_path / "home" / "run"
    rt.mkdir(parents=True, mode=0o700)
    user = {**env, "HOME": str(home), "XDG_RUNTIME_DIR": str(rt), "DDPTOP_RUNTIME_DIR": str(rt / "ddptop"),
            "COLUMNS": "200"}

    res = _run([str(ddptop), "--version"], timeout=60, env=user, cwd=home)
    assert res.returncode == 0 and res.stdout.strip() == f"ddptop {version}", (res.stdout, res.stderr)

    # The kept real NCCL evidence (one H100: a Flight Recorder dump and torchrun's log):
    # findings of warning or worse exit 1 (FindingsPresent, README "I only have the dumps").
    res = _run([str(ddptop), "doctor", str(NCCL_H100)], timeout=120, env=user, cwd=home)
    assert res.returncode == FindingsPresent.exit_code == 1, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    assert "collective_stall" in res.stdout and "timed out in ALLREDUCE" in res.stdout, res.stdout
    assert "rank 0: ALLREDUCE" in res.stdout, res.stdout

    # No jobs in a runtime dir of its own: a one-line answer naming where it looked, exit 0.
    res = _run([str(ddptop), "jobs"], timeout=60, env=user, cwd=home)
    assert res.returncode == 0 and "Traceback" not in res.stderr, (res.stdout, res.stderr)
    if not res.stdout.startswith("no ddptop jobs"):
        # Another test's job in a private /tmp (seen through /proc/PID/root) may show up on a
        # shared machine; none may come from this runtime dir.
        res = _run([str(ddptop), "jobs", "--json"], timeout=60, env=user, cwd=home)
        assert res.returncode == 0, res.stderr
        ours = [j for j in json.loads(res.stdout)["jobs"] if j["runtime_dir"] == str(rt / "ddptop")]
        assert ours == [], ours
    else:
        assert f"looked in {rt / 'ddptop'}" in res.stdout, res.stdout
