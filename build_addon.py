"""Build the installable Blender add-on: python build_addon.py  ->  dist/splatwright-<version>.zip

The zip holds the package splatwright/: the files of blender_addon/ as they are in the tree (core/ among
them, the modules the add-on shares with the backend), and in splatwright/backend_src/ everything the backend
needs to run from the zip alone: the backend/ package, the CUDA sources in cuda/, the blender_addon package's
__init__.py and core/ (the backend imports them as blender_addon.core), requirements.txt, the backend's
requirements from pyproject.toml, and in kernels/ the prebuilt kernels' wheels given with --kernels
(build_kernels.py makes them; Set Up Backend installs the one that fits). Nothing in it names a path of the
build machine.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
from pathlib import Path

from blender_addon.core.files import replacing
from blender_addon.logic.environment import KERNELS, KERNELS_WHEEL, REQUIREMENTS, SOURCES

ROOT = Path(__file__).resolve().parent
ADDON = ROOT / "blender_addon"
PACKAGE = "splatwright"


def version() -> str:
    """The project version, which bl_info and the extension manifest must repeat."""
    v = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    manifest = tomllib.loads((ADDON / "blender_manifest.toml").read_text())
    bl_info = re.search(r'"version":\s*\((\d+),\s*(\d+),\s*(\d+)\)', (ADDON / "__init__.py").read_text())
    found = {"blender_manifest.toml": manifest["version"],
             "bl_info": ".".join(bl_info.groups()) if bl_info else "missing"}
    wrong = {k: x for k, x in found.items() if x != v}
    if wrong:
        raise SystemExit(f"version {v} in pyproject.toml, but {wrong}; make them agree")
    return v


def torch_imports(path: Path) -> bool:
    return re.search(r"^\s*(import|from)\s+torch\b", path.read_text(), re.MULTILINE) is not None


def requirements() -> str:
    """The backend's requirements: the torch that ./run installs, then pyproject.toml's other dependencies."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    others = [r for r in pyproject["project"]["dependencies"] if not r.startswith("torch")]
    torch = f"torch=={pyproject['tool']['splatwright']['torch']}"
    return "# The backend's requirements, from pyproject.toml; torch is installed first, its build to match " \
           "the machine\n" + "\n".join([torch, *others]) + "\n"


def tree(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts
            and p.suffix != ".pyc"]


def build(out_dir: Path, kernels: list[Path] = ()) -> Path:
    v = version()
    wrong = [p.name for p in kernels if not KERNELS_WHEEL.fullmatch(p.name)]
    if wrong:
        raise SystemExit(f"not wheels of the prebuilt kernels (build_kernels.py makes them): {', '.join(wrong)}")
    files = {f"{PACKAGE}/{p.relative_to(ADDON).as_posix()}": p for p in tree(ADDON)}
    heavy = [name for name, p in files.items() if p.suffix == ".py" and torch_imports(p)]
    if heavy:
        raise SystemExit(f"the add-on must not import torch, but these do: {', '.join(heavy)}")
    backend = [*(p for p in tree(ROOT / "backend") if ROOT / "backend" / "tools" not in p.parents),  # no tools
               *tree(ROOT / "cuda"), ADDON / "__init__.py", *tree(ADDON / "core")]
    files.update({f"{PACKAGE}/{SOURCES}/{p.relative_to(ROOT).as_posix()}": p for p in backend})
    files.update({f"{PACKAGE}/{SOURCES}/{KERNELS}/{p.name}": p for p in kernels})
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{PACKAGE}-{v}.zip"
    with replacing(target) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, path in files.items():
            z.write(path, name)
        z.writestr(f"{PACKAGE}/{SOURCES}/{REQUIREMENTS}", requirements())
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "dist"), help="output folder (default: dist/)")
    parser.add_argument("--kernels", nargs="*", default=[], type=Path,
                        help="wheels of the prebuilt CUDA kernels to carry (build_kernels.py makes them)")
    args = parser.parse_args(argv)
    target = build(Path(args.out), args.kernels)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
