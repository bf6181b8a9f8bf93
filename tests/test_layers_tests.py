"""The tests' own layout: pytest finds the checkout and the helpers through pyproject.toml's pythonpath, and a
Blender scenario the harness through the PYTHONPATH the runner gives it, so nothing edits sys.path; the test
files share fixtures through conftest.py and helpers through the helper modules, never through another test
file; a scenario imports the harness (tests/blender/), never another scenario."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HARNESS = TESTS / "blender"
SCENARIOS = HARNESS / "scenarios"


def sources() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def imported(path: Path) -> list[str]:
    """The modules `path` imports anywhere in it (a name imported from a package counts as its module)."""
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules += [f"{node.module}.{alias.name}" if node.module == "blender" else node.module
                        for alias in node.names]
    return modules


def test_no_file_of_the_tests_changes_sys_path():
    """Nor reads it: none needs to."""
    uses = [f"{p.relative_to(TESTS)}:{node.lineno}" for p in sources()
             for node in ast.walk(ast.parse(p.read_text(), str(p)))
             if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
             and node.value.id == "sys"]
    assert uses == []


def test_no_file_imports_a_test_file_or_conftest():
    found = [(str(p.relative_to(TESTS)), m) for p in sources() for m in imported(p)
             if m.split(".")[0].startswith("test_") or m.split(".")[0] == "conftest"]
    assert found == []


def test_scenarios_import_the_harness_and_never_each_other():
    """Of the modules here, a scenario imports the harness's own (blender.kit, blender.splat_scene, ...); nor does
    the harness import a scenario or the pytest side's helpers."""
    scenarios, harness = sorted(SCENARIOS.glob("*.py")), sorted(HARNESS.glob("*.py"))
    assert scenarios
    allowed = {f"blender.{p.stem}" for p in harness if p.stem != "__init__"}
    local = {p.stem for p in TESTS.glob("*.py")} | {p.stem for p in scenarios} | {"blender"}
    found = [(str(p.relative_to(TESTS)), m) for p in [*scenarios, *harness]
             for m in imported(p) if m.split(".")[0] in local and m not in allowed]
    assert found == []
