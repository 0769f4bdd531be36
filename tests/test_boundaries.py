"""Import boundaries: what a rank loads must stay small and free of viewer code.

Checked in fresh interpreters (a test process has long since imported everything), and
with import-linter's contract from ``pyproject.toml`` when it is installed.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VIEWER = ("textual", "rich", "ddptop.tui", "ddptop.cli", "ddptop.client", "ddptop.model",
          "ddptop.diagnosis", "ddptop.bundle", "prometheus_client")


def _modules_after(code: str) -> set[str]:
    """sys.modules of a fresh interpreter after running *code*."""
    probe = code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stdout.strip().splitlines()[-1]))


def _viewer_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == v or m.startswith(v + ".") for v in VIEWER))


@pytest.mark.parametrize("code", [
    "import ddptop.reporter",
    "import ddptop.reporter; ddptop.reporter.install",
    "import ddptop.reporter.sampler, ddptop.net.server, ddptop.reporter.progress",
    "import ddptop.reporter.collectives, ddptop.reporter.system, ddptop.reporter.environment",
    "import ddptop.reporter.crash, ddptop.reporter.stacks, ddptop.reporter.store_publish",
    "import ddptop.reporter.config, ddptop.reporter.torch_import",
    "import ddptop, ddptop.protocol, ddptop.wire, ddptop.store.discovery, ddptop.auth, ddptop.secrets_filter",
])
def test_reporter_imports_no_viewer_code(code: str) -> None:
    """The rank side never pulls textual, rich or viewer packages into a training process."""
    loaded = _modules_after(code)
    assert "ddptop" in loaded  # the probe really imported something
    assert _viewer_modules(loaded) == []


def test_install_in_a_rank_loads_no_viewer_code(tmp_path: Path) -> None:
    """Even a started reporter (RANK set, agent thread running) stays on its side."""
    code = (
        "import os; os.environ.update(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', "
        f"DDPTOP_RUNTIME_DIR={str(tmp_path)!r}, DDPTOP_JOB_ID='bt')\n"
        "import ddptop; assert ddptop.install()\n"
        "import time; from ddptop.reporter import current; r = current(); t = time.monotonic()\n"
        "while not r.stats.samples and time.monotonic() - t < 30: time.sleep(0.01)\n"  # its first sample
        "assert r.stats.samples; r.shutdown()\n"
    )
    loaded = _modules_after(code)
    assert "ddptop.reporter.sampler" in loaded
    assert _viewer_modules(loaded) == []
    assert "torch" not in loaded  # the reporter waits for the script to import torch


def test_import_ddptop_does_not_import_torch() -> None:
    """``import ddptop`` is cheap: it is loaded into every rank and every viewer."""
    loaded = _modules_after("import ddptop")
    assert "torch" not in loaded
    assert "msgspec" not in loaded and "psutil" not in loaded


def test_sitecustomize_outside_a_rank_loads_nothing() -> None:
    """Without RANK the injected sitecustomize must not even import the reporter."""
    inject = ROOT / "ddptop" / "_inject"
    res = subprocess.run(
        [sys.executable, "-c", "import sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{inject}:{ROOT}"})
    assert res.returncode == 0, res.stderr
    loaded = set(json.loads(res.stdout.strip().splitlines()[-1]))
    assert "sitecustomize" in loaded
    assert not any(m.startswith("ddptop.reporter") for m in loaded)


def test_import_linter_contract() -> None:
    """Run `lint-imports` on the contract in pyproject.toml (it is a test dependency: fail without it)."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert exe is not None, "import-linter is not installed (pip install -e '.[test]')"
    res = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "KEPT" in res.stdout and "BROKEN" not in res.stdout
    assert "The house: every room imports only the rooms below it KEPT" in res.stdout
    assert "Viewer rooms never import the reporter KEPT" in res.stdout


def _room(module: str) -> str:
    """The room of a ddptop module: its top-level package or module ("" for the root facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def room_graph() -> dict[str, set[str]]:
    """Room -> the rooms it imports, from every import statement of ddptop/ (module level,
    in functions and under TYPE_CHECKING alike: a cycle through any of them is a knot)."""
    graph: dict[str, set[str]] = {}
    package = ROOT / "ddptop"
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        source = _room(module)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddptop"):
                targets = ([f"ddptop.{a.name}" for a in node.names] if node.module == "ddptop"
                           else [str(node.module)])
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ddptop")]
            else:
                continue
            for target in targets:
                room = _room(target)
                real = (package / room).is_dir() or (package / f"{room}.py").exists()
                if room and room != source and real:
                    graph.setdefault(source, set()).add(room)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one room (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_rooms() -> None:
    """The rooms (ddptop's top-level packages and modules) import downhill only: no knot."""
    graph = room_graph()
    assert {"agent", "client", "store", "reporter"} <= set(graph)  # the graph is really read
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_knot() -> None:
    """The check above can fail: the knot #21 found (agent -> client -> agent) is named."""
    graph = {k: set(v) for k, v in room_graph().items()}
    graph["client"].add("agent")
    assert any({"agent", "client"} <= set(group) for group in cycles(graph))


def _is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def file_graph() -> dict[str, set[str]]:
    """Module -> the ddptop modules it imports (a package is its __init__), from every import
    statement: module level, in functions and under TYPE_CHECKING alike."""
    graph: dict[str, set[str]] = {}
    for path in (ROOT / "ddptop").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ddptop"):
                base = str(node.module)
                targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ddptop")]
            else:
                continue
            graph.setdefault(module, set()).update(t for t in targets if t != module and _is_module(t))
    return graph


def test_no_import_cycle_between_files() -> None:
    """Files import downhill too: no module reaches itself through others (#35: the four
    circles it found were moved apart, or read through a Protocol of what they use)."""
    graph = file_graph()
    assert "ddptop.model.status_index" in graph["ddptop.model.job"]  # the graph is really read
    assert cycles(graph) == []


def test_the_file_cycle_finder_finds_a_circle() -> None:
    graph = {k: set(v) for k, v in file_graph().items()}
    graph["ddptop.model.status_index"].add("ddptop.model.job")  # the circle #35 found
    assert ["ddptop.model.job", "ddptop.model.status_index"] in cycles(graph)


@pytest.mark.parametrize("code", [
    "import ddptop.cli.main, ddptop.cli.demo, ddptop.cli.export, ddptop.cli.replay",
    "import ddptop.tui.app, ddptop.agent.node, ddptop.client.capture, ddptop.client.collect",
])
def test_the_product_never_loads_the_test_kit(code: str) -> None:
    """Fakes stay out of what users run: the viewer, the agent and the CLI load no
    ``ddptop.testing`` module, and bundle/client code loads no reporter module."""
    loaded = _modules_after(code)
    assert "ddptop.cli.main" in loaded or "ddptop.tui.app" in loaded
    assert sorted(m for m in loaded if m.startswith("ddptop.testing")) == []
    if "ddptop.cli.main" not in loaded:  # the CLI's launch verb may load the rank side
        assert sorted(m for m in loaded if m.startswith("ddptop.reporter")) == []


def test_launch_imports_prometheus_client_only_to_serve_metrics() -> None:
    """A launch without ``--metrics-port`` pays nothing for metrics (nor does a rank)."""
    assert "prometheus_client" not in _modules_after("import ddptop.cli.launch, ddptop.agent.node")
    assert "prometheus_client" in _modules_after("import ddptop.agent.metrics")


def test_the_wheel_ships_what_runs_without_a_checkout(tmp_path: Path) -> None:
    """`pip install ./ddptop` then `ddptop demo`, `ddptop launch`: the demo's job, the injected
    sitecustomize, the node agent and the styles are in the wheel (built from a copy of the
    tracked files, so the checkout is never written)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                           check=True).stdout.split()
    src = tmp_path / "src"
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             "-w", str(tmp_path / "dist"), str(src)]
    res = subprocess.run(build, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("ddptop-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("ddptop/_demo/unseeded_split.py", "ddptop/_demo/train_common.py",
                   "ddptop/_inject/sitecustomize.py", "ddptop/agent/node.py", "ddptop/agent/metrics.py",
                   "ddptop/store/job_token.py", "ddptop/py.typed"):
        assert needed in names, needed
    assert any(n.endswith(".tcss") for n in names)
    assert not any(n.startswith(("tests/", "probes/", "bench/")) for n in names)
