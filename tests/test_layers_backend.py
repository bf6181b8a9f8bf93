"""The backend's three parts import downward only: the library (backend/ but service/ and tools/) imports neither
the service nor the tools, the service does not import the tools, and only `python -m backend` (__main__.py)
starts the tools. The library and the service import no add-on module but its core (the add-on's zip carries no
other beside them), nothing imports the tests, and imports stand at the top of modules. Read from each module's
source with ast: nothing is imported or run."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BACKEND = REPO / "backend"
ENTRY = "backend.__main__"  # the command line: the one module above the tools

# Imports that may stand inside a function, and why: each is heavy and only the call that needs it pays for it.
LAZY = {
    "torch.utils.cpp_extension": "the CUDA extension's build, at first use; importing it loads setuptools",
    "pycolmap": "structure from motion (data/photos.py): a large native library that only the photos command and "
                "distorted COLMAP models need, so a backend without it trains and serves as before",
    "av": "PyAV, a video's frames for structure from motion (data/video.py): only a video needs it",
    "gsplat": "the peer the benchmarks compare against: optional, and importing it may build its CUDA code",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part(name: str) -> str:
    for upper in ("backend.tools", "backend.service"):
        if name == upper or name.startswith(upper + "."):
            return upper
    return "backend"


class Imports(ast.NodeVisitor):
    """Every module a source imports, with its line and whether the import sits inside a function."""

    def __init__(self, name: str, is_package: bool):
        self.package = name if is_package else name.rpartition(".")[0]
        self.found: list[tuple[str, int, bool]] = []
        self.depth = 0

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_Import(self, node: ast.Import):
        self.found += [(alias.name, node.lineno, self.depth > 0) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level:
            base = self.package.split(".")[:len(self.package.split(".")) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module
        # A name imported from a module may be a submodule of it: count both.
        self.found += [(name, node.lineno, self.depth > 0)
                       for alias in node.names for name in (module, f"{module}.{alias.name}")]


def backend_modules() -> dict[str, tuple[Path, list[tuple[str, int, bool]]]]:
    modules = {}
    for path in sorted(BACKEND.rglob("*.py")):
        name = module_name(path)
        visitor = Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        modules[name] = (path, visitor.found)
    return modules


MODULES = backend_modules()


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def offences(rule) -> list[str]:
    return sorted({f"{path.relative_to(REPO)}:{line} imports {imported}"
                   for name, (path, found) in MODULES.items() for imported, line, _ in found if rule(name, imported)})


def test_the_library_imports_neither_the_service_nor_the_tools():
    assert offences(lambda name, imported: part(name) == "backend" and name != ENTRY
                    and part(imported) != "backend") == []


def test_the_service_does_not_import_the_tools():
    assert offences(lambda name, imported: part(name) == "backend.service"
                    and part(imported) == "backend.tools") == []


def test_the_library_and_the_service_import_only_the_add_ons_core():
    assert offences(lambda name, imported: part(name) != "backend.tools" and within(imported, "blender_addon")
                    and imported != "blender_addon" and not within(imported, "blender_addon.core")) == []


def test_nothing_in_the_backend_imports_or_runs_the_tests():
    assert offences(lambda name, imported: within(imported, "tests")) == []
    named = [f"{path.relative_to(REPO)}:{node.lineno}" for path, _ in MODULES.values()
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and (node.value == "tests" or node.value.startswith("tests/"))]
    assert named == []  # e.g. ROOT / "tests" / "some_scenario.py"


def test_imports_stand_at_the_top_of_modules():
    inside = sorted({f"{path.relative_to(REPO)}:{line} imports {imported}"
                     for path, found in MODULES.values() for imported, line, in_function in found
                     if in_function and not any(within(imported, lazy) for lazy in LAZY)})
    assert inside == []


def test_the_package_ships_every_part_of_the_backend_and_its_kernels():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {module_name(p.parent / "__init__.py") for p in BACKEND.rglob("__init__.py")}
    assert packages | {"backend.cuda"} <= set(setuptools["packages"])
    assert setuptools["package-dir"]["backend.cuda"] == "cuda"
    shipped = setuptools["package-data"]["backend.cuda"]
    sources = {p.suffix for p in (REPO / "cuda").iterdir() if p.name != "README.md"}  # the notes stay behind
    assert sources <= {pattern.removeprefix("*") for pattern in shipped}
