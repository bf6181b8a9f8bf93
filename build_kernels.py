"""Build the prebuilt CUDA kernels' wheel: python build_kernels.py --torch 2.13.0 --python 3.11 3.13
    ->  dist/splatwright_kernels-<version>+torch<torch>.cu<cuda>.src<hash>-cp<python>-cp<python>-linux_x86_64.whl

For Linux x86_64, with nvcc (of the CUDA major version that torch's build uses) and a Python of each version
(python3.X on PATH, or pyenv's) for its headers. torch's own wheel comes from PyPI (its Linux wheels are CUDA
builds; --torch-wheel takes one from elsewhere, such as another CUDA build from download.pytorch.org); its
headers and libraries are unpacked once into the cache, and the kernels' objects are kept there too, so a rerun
compiles only what changed. The wheel holds the package splatwright_kernels: the module _C and build.json, which
says the torch version, its CUDA, the Python, the GPU architectures and the hash of cuda/ it was built from;
backend/kernels.py loads it only where all of them fit.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from backend.kernels import BUILD_INFO, CUDA_DIR, CUDA_FLAGS, CXX_FLAGS, PREBUILT, SOURCES, sources_hash
from blender_addon.core.files import replacing

ROOT = Path(__file__).resolve().parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"  # Turing to Blackwell; PTX for later GPUs
# torch.utils.cpp_extension's flags for nvcc, which the build at first use gets too
NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC"]
TORCH_LIBS = ["c10", "c10_cuda", "torch_cpu", "torch_cuda", "torch", "torch_python"]
PLATFORM = "linux_x86_64"
PYPI = "https://pypi.org/simple"
DEFAULT_CACHE = Path.home() / ".cache" / "splatwright" / "kernels-build"
INIT = '"""Splatwright\'s CUDA kernels, prebuilt (build.json says for what); backend/kernels.py loads _C."""\n'


def run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{what} failed:\n{' '.join(argv)}\n{done.stdout}{done.stderr}")
    return done.stdout


def gencode(archs: list[str]) -> list[str]:
    """nvcc's targets for architectures as TORCH_CUDA_ARCH_LIST writes them ('8.6', '12.0+PTX')."""
    flags = []
    for arch in archs:
        number = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{number},code=sm_{number}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{number},code=compute_{number}")
    return flags


def find_python(version: str) -> dict:
    """The include folder and extension suffix of a Python `version` that runs here."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [f"python{version}", *sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}")), reverse=True)]
    for python in candidates:
        try:
            out = subprocess.run([python, "-c", "import json, sysconfig; print(json.dumps({'include': "
                                  "sysconfig.get_path('include'), 'suffix': sysconfig.get_config_var('EXT_SUFFIX')}))"],
                                 capture_output=True, text=True)
        except OSError:
            continue
        if out.returncode == 0:
            return json.loads(out.stdout)
    raise SystemExit(f"no Python {version} runs here (tried {', '.join(candidates)}); its headers are needed")


def torch_parts(version: str, python: str, wheel: str | None, cache: Path) -> tuple[Path, dict]:
    """torch's headers and libraries for `python`, unpacked from its wheel into the cache, and its build
    (version, cuda) from torch/version.py."""
    tag = "cp" + python.replace(".", "")
    folder = cache / f"torch-{version}-{tag}"
    if not (folder / "done").exists():
        if wheel is not None and f"-{tag}-" not in Path(wheel).name:
            raise SystemExit(f"{wheel} is not torch's wheel for Python {python}")
        if wheel is None:
            downloads = cache / "wheels"
            found = sorted(downloads.glob(f"torch-{version}-{tag}-*.whl"))
            if not found:  # from PyPI alone (--isolated): other indexes may hold torch's CPU build
                print(f"downloading torch {version} for Python {python} from PyPI (about 600 MB)...", flush=True)
                run([sys.executable, "-m", "pip", "download", "--isolated", "--index-url", PYPI, "--no-deps",
                     f"torch=={version}", "--python-version", python, "--platform", "manylinux_2_28_x86_64",
                     "--only-binary=:all:", "-d", str(downloads)], "pip download")
                found = sorted(downloads.glob(f"torch-{version}-{tag}-*.whl"))
            if not found:
                raise SystemExit(f"pip downloaded no torch {version} CUDA wheel for Python {python} into {downloads}")
            wheel = str(found[0])
        print(f"unpacking torch's headers and libraries from {Path(wheel).name}...", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(folder, [n for n in z.namelist() if n.startswith("torch/include/") or n == "torch/version.py"
                                  or re.fullmatch(r"torch/lib/lib(torch|c10)\w*\.so", n)])
        (folder / "done").write_text(Path(wheel).name)
    info = {}
    exec((folder / "torch" / "version.py").read_text(), info)
    if info["__version__"].split("+")[0] != version or not info["cuda"]:
        raise SystemExit(f"{(folder / 'done').read_text()} is torch {info['__version__']} with CUDA {info['cuda']}, "
                         f"not torch {version} built for CUDA")
    return folder / "torch", {"torch": version, "cuda": info["cuda"]}


def compile_cached(argv: list[str], source: Path, cache: Path) -> Path:
    """Compiles `source` with `argv` (less its -c and -o) into the cache, unless the same source, headers and
    flags were compiled before."""
    h = hashlib.sha256(" ".join(argv).encode())
    h.update(source.read_bytes())
    for header in sorted([*CUDA_DIR.glob("*.h"), *CUDA_DIR.glob("*.cuh")]):
        h.update(header.read_bytes())
    obj = cache / "objects" / f"{source.stem}-{h.hexdigest()[:16]}.o"
    if not obj.exists():
        obj.parent.mkdir(parents=True, exist_ok=True)
        print(f"compiling {source.name}...\n", end="", flush=True)  # one write: files compile side by side
        with replacing(obj) as tmp:
            run([*argv, "-c", str(source), "-o", str(tmp)], f"compiling {source.name}")
    return obj


def check_nvcc(cuda: str) -> str:
    if shutil.which("nvcc") is None:
        raise SystemExit("nvcc is not on PATH: install the CUDA toolkit")
    found = re.search(r"release (\d+)\.(\d+)", run(["nvcc", "--version"], "nvcc --version"))
    if found.group(1) != cuda.split(".")[0]:
        raise SystemExit(f"nvcc is CUDA {found.group(1)}.{found.group(2)}, torch's build is for CUDA {cuda}: put a "
                         f"CUDA {cuda.split('.')[0]}.x nvcc on PATH")
    return f"{found.group(1)}.{found.group(2)}"


def build_module(torch_dir: Path, python: dict, archs: list[str], cache: Path, out: Path) -> None:
    """Compiles the kernels (in parallel) and links them with torch into the module `out`."""
    kernel_args = ["nvcc", *NVCC_FLAGS, *gencode(archs), *CUDA_FLAGS, f"-I{CUDA_DIR}"]
    binding_args = ["nvcc", "-Xcompiler", "-fPIC", *CXX_FLAGS, f"-I{CUDA_DIR}", "-DTORCH_EXTENSION_NAME=_C",
                    "-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", str(torch_dir / "include"),
                    "-isystem", str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"),
                    "-isystem", python["include"]]
    jobs = [(binding_args if s.endswith(".cpp") else kernel_args, CUDA_DIR / s) for s in SOURCES]
    with ThreadPoolExecutor() as pool:
        objects = list(pool.map(lambda job: compile_cached(*job, cache), jobs))
    print(f"linking {out.name}...", flush=True)
    run(["nvcc", "-shared", "--cudart", "shared", *map(str, objects), "-o", str(out), f"-L{torch_dir / 'lib'}",
         *(f"-l{lib}" for lib in TORCH_LIBS)], "linking")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(out_dir: Path, module: Path, suffix: str, build: dict) -> Path:
    """The wheel of the package splatwright_kernels: _C, build.json and an __init__.py."""
    tag = "cp" + build["python"].replace(".", "")
    version = (f"{PYPROJECT['project']['version']}+torch{build['torch']}.cu{build['cuda'].replace('.', '')}"
               f".src{build['sources']}")
    dist_info = f"{PREBUILT}-{version}.dist-info"
    files = {
        f"{PREBUILT}/__init__.py": INIT.encode(),
        f"{PREBUILT}/{BUILD_INFO}": json.dumps(build, indent=2).encode(),
        f"{PREBUILT}/_C{suffix}": module.read_bytes(),
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: {PREBUILT}\nVersion: {version}\n"
                                  f"Summary: Splatwright's CUDA kernels for torch {build['torch']} (CUDA "
                                  f"{build['cuda']}), Python {build['python']}, GPU architectures "
                                  f"{';'.join(build['archs'])}\n").encode(),
        f"{dist_info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: build_kernels.py\nRoot-Is-Purelib: false\n"
                               f"Tag: {tag}-{tag}-{PLATFORM}\n").encode(),
    }
    record = [record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{PREBUILT}-{version}-{tag}-{tag}-{PLATFORM}.whl"
    with replacing(target) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return target


def build(torch_version: str, pythons: list[str], archs: list[str], out_dir: Path, cache: Path,
          torch_wheel: str | None = None) -> list[Path]:
    wheels = []
    for python in pythons:
        torch_dir, build_info = torch_parts(torch_version, python, torch_wheel, cache)
        nvcc = check_nvcc(build_info["cuda"])
        target_python = find_python(python)
        module = cache / f"_C-{torch_version}-{python}{target_python['suffix']}"
        build_module(torch_dir, target_python, archs, cache, module)
        build_info = {**build_info, "python": python, "archs": archs, "sources": sources_hash(), "nvcc": nvcc}
        wheels.append(write_wheel(out_dir, module, target_python["suffix"], build_info))
        print(wheels[-1], flush=True)
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", default=PYPROJECT["tool"]["splatwright"]["torch"],
                        help="the torch version (default: the one the backend pins in pyproject.toml)")
    parser.add_argument("--python", nargs="+", default=[f"{sys.version_info.major}.{sys.version_info.minor}"],
                        help="Python versions, one wheel each (default: this Python's)")
    parser.add_argument("--arch", default=ARCHS, help=f"GPU architectures (default: {ARCHS})")
    parser.add_argument("--torch-wheel", help="torch's wheel to build against, instead of PyPI's")
    parser.add_argument("--out", default=str(ROOT / "dist"), help="output folder (default: dist/)")
    parser.add_argument("--cache", default=str(DEFAULT_CACHE),
                        help="torch's unpacked parts and the compiled objects (default: %(default)s)")
    args = parser.parse_args(argv)
    if sys.platform != "linux":
        raise SystemExit("the prebuilt kernels are built on Linux x86_64")
    build(args.torch, args.python, args.arch.split(";"), Path(args.out), Path(args.cache), args.torch_wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
