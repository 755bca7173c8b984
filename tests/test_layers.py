"""The layering rule: the decoding core loads neither Hydra nor OmegaConf nothing from the layers above it (bench,
training, tracking, report), and no module of the package imports itself back through others (no cycle).

Checked on the import statements of the source (every ``import``, at module level or inside a function), followed
transitively through the package; one subprocess confirms it at run time for the issue's own example."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
ABOVE = ("hydra", "omegaconf", "specnoise.bench", "specnoise.training", "specnoise.tracking", "specnoise.report",
         "specnoise.__main__", "specnoise.conf_store", "specnoise.callbacks")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SRC.glob("specnoise/**/*.py")}


def imports(module: str) -> set[str]:
    """What ``module``'s source imports: package modules by full name, others by top-level name."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in MODULES:
                found.add(name)
            elif not name.startswith("specnoise"):
                found.add(name.split(".")[0])
    return found - {module}


def reachable(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for name in imports(todo.pop()) - seen:
            seen.add(name)
            if name in MODULES:
                todo.append(name)
    return seen


DECODING = sorted(m for m in MODULES if m.startswith("specnoise.decoding"))


@pytest.mark.parametrize("module", DECODING)
def test_the_decoding_core_imports_nothing_from_above(module):
    above = sorted(m for m in reachable(module) if m.startswith(ABOVE) or m in ABOVE)
    assert not above, f"{module} reaches {above}"


def test_no_import_cycle():
    """Module-level imports only (a function-level import runs after its module loaded: that is how a lower layer may
    reach a higher one lazily)."""
    def top_level(module):
        tree = ast.parse(MODULES[module].read_text())
        out = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out |= {n for n in [node.module] + [f"{node.module}.{a.name}" for a in node.names] if n in MODULES}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in MODULES}
        return out - {module}

    graph = {m: top_level(m) for m in MODULES}
    state: dict[str, int] = {}

    def visit(m, stack):
        state[m] = 1
        for n in graph[m]:
            if n.startswith(m + ".") or m.startswith(n + "."):
                continue  # a package and its own submodules
            assert state.get(n) != 1, "import cycle: " + " -> ".join(stack + [m, n])
            if n not in state:
                visit(n, stack + [m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def test_importing_a_decoder_loads_neither_hydra_nor_omegaconf():
    code = ("import specnoise.decoding.tr_jacobi, sys; "
            "assert 'hydra' not in sys.modules and 'omegaconf' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode == 0
