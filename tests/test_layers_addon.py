"""The add-on's layers: each folder imports only the folders below it, never inside a function to dodge a
circle, and the bpy-free layers import without Blender."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ADDON = Path(__file__).resolve().parent.parent / "blender_addon"
PACKAGE = "blender_addon"
LAYERS = ("core", "logic", "scene", "render", "ops", "ui")  # bottom to top; the package's __init__ is above all
BPY_FREE = ("core", "logic")
SHARED_OPS = "blender_addon.ops.base"  # the one module the feature operators share
# Registration imports every layer inside a function so that the package imports without bpy.
LAZY_ALLOWED = {"blender_addon"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ADDON.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ADDON.rglob("*.py"))}


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """(imported add-on module, inside a function) for each import of the add-on's own modules in `path`."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = modules()
    found = []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base == PACKAGE or base.startswith(PACKAGE + "."):
                    # `from . import x` names a module x; `from .m import y` names module m
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            elif isinstance(child, ast.Import):
                targets = [a.name for a in child.names if a.name.split(".")[0] == PACKAGE]
            found.extend((t, inner) for t in targets)
            visit(child, inner)
    visit(tree, False)
    return found


def test_every_module_belongs_to_a_layer():
    loose = [n for n in modules() if layer(n) == len(LAYERS) and n != PACKAGE]
    assert not loose, f"modules outside the layer folders {LAYERS}: {loose}"


def test_imports_go_only_downward():
    wrong = []
    for name, path in modules().items():
        for target, _ in imports(name, path):
            if layer(target) > layer(name):
                wrong.append(f"{name} imports {target} (a layer above)")
            elif name.startswith("blender_addon.ops.") and target.startswith("blender_addon.ops.") \
                    and target != SHARED_OPS and name != SHARED_OPS:
                wrong.append(f"{name} imports {target}: operators share only {SHARED_OPS}")
    assert not wrong, "\n".join(wrong)


def test_no_import_of_the_addon_inside_a_function():
    wrong = [f"{name} imports {target} inside a function" for name, path in modules().items()
             if name not in LAZY_ALLOWED for target, inner in imports(name, path) if inner]
    assert not wrong, "\n".join(wrong)


def test_no_circles():
    graph = {name: {t for t, _ in imports(name, path) if t != name} for name, path in modules().items()}
    state: dict[str, str] = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                pytest.fail("circle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def bpy_free_modules() -> list[str]:
    return [n for n in modules() if layer(n) < len(LAYERS) and LAYERS[layer(n)] in BPY_FREE]


def test_bpy_free_layers_use_the_standard_library_and_numpy_only():
    allowed = set(sys.stdlib_module_names) | {"numpy", PACKAGE}
    wrong = []
    for name in bpy_free_modules():
        for node in ast.walk(ast.parse(modules()[name].read_text())):
            found = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            wrong += [f"{name} imports {m}" for m in found if m.split(".")[0] not in allowed]
    assert not wrong, "\n".join(wrong)


def test_bpy_free_layers_import_without_blender():
    names = bpy_free_modules()
    assert {"blender_addon.logic.runtime", "blender_addon.core.protocol"} <= set(names)
    blocked = ["bpy", "bpy_extras", "mathutils", "gpu", "gpu_extras", "blf", "_cycles"]
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None  # importing one raises ImportError\n"
            f"import importlib\nfor n in {names!r}: importlib.import_module(n)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ADDON.parent, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
