"""The CUDA kernels (cuda/: rasterizer, loss, optimizer, densification statistics) as a Python module.

The sources are cuda/ beside the backend package in a checkout and in the add-on's zip (backend_src/cuda), and
the package data backend/cuda/ where the backend is installed (pyproject.toml maps it from cuda/).

extension() loads, in this order:
1. the prebuilt kernels, the package splatwright_kernels (a wheel that build_kernels.py makes), where its
   build.json says they were built for this torch version, its CUDA, this Python, this GPU's architecture and
   these sources (their hash);
2. else a build at first use with torch.utils.cpp_extension.load (ninja, nvcc), into a cache directory keyed by
   a hash of the sources, the torch version and the target architectures: ~/.cache/splatwright/ext-<hash>, or
   $SPLATWRIGHT_EXT_CACHE/ext-<hash>. Architectures come from TORCH_CUDA_ARCH_LIST, else the GPUs present.
Where neither works, the failure is kept for the process: handles() then leaves CUDA tensors to torch, and the
policy trains on the GPU through the reference rasterizer (fallback_note() says why that is slow).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import threading
from pathlib import Path

import torch

from blender_addon.core.errors import SplatwrightError

try:
    import fcntl
except ImportError:  # not on Windows: building() then takes torch's own lock alone
    fcntl = None

_PACKAGE = Path(__file__).resolve().parent
CUDA_DIR = _PACKAGE / "cuda" if (_PACKAGE / "cuda").is_dir() else _PACKAGE.parent / "cuda"  # see above
SOURCES = ("bindings.cpp", "projection_fwd.cu", "projection_bwd.cu", "motion.cu", "binning.cu", "rasterize_fwd.cu",
           "rasterize_bwd.cu", "film.cu", "training.cu")
CUDA_FLAGS = ["-O3", "-std=c++17", "--ftz=true"]  # flush denormals: leaner exp/rcp in the pixel loops
CXX_FLAGS = ["-O3", "-std=c++17"]
PREBUILT = "splatwright_kernels"  # the prebuilt kernels' package: build.json and the module _C
BUILD_INFO = "build.json"

_ext = None
_ext_origin = ""  # where the loaded module came from, for reports
_failure: str | None = None  # why the kernels could not be loaded in this process
_ext_lock = threading.Lock()


def _arch_key() -> str:
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in caps)


def _add_sources(h) -> None:
    for path in sorted(CUDA_DIR.glob("*")):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            h.update(path.name.encode())
            h.update(path.read_bytes())


def sources_hash() -> str:
    """A hash of the kernels' sources, which a prebuilt module records."""
    h = hashlib.sha256()
    _add_sources(h)
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """Cache directory for the current sources, torch version and target architectures."""
    h = hashlib.sha256()
    _add_sources(h)
    h.update(torch.__version__.encode())
    h.update(_arch_key().encode())
    h.update(" ".join(CUDA_FLAGS + CXX_FLAGS).encode())
    root = os.environ.get("SPLATWRIGHT_EXT_CACHE") or Path.home() / ".cache" / "splatwright"
    return Path(root) / f"ext-{h.hexdigest()[:16]}"


def this_machine() -> dict:
    """What a prebuilt module must have been built for here (the keys of its build.json)."""
    return {"torch": torch.__version__.split("+")[0], "cuda": torch.version.cuda,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}", "sources": sources_hash(),
            "capability": torch.cuda.get_device_capability()}


def runs_on(arch: str, capability: tuple[int, int]) -> bool:
    """Whether code built for `arch` ('8.6', or '12.0+PTX' with PTX) runs on a GPU of `capability`: machine code
    on the same major version and a minor as high or higher, PTX on any later GPU."""
    major, minor = (int(x) for x in arch.removesuffix("+PTX").split("."))
    if arch.endswith("+PTX"):
        return tuple(capability) >= (major, minor)
    return capability[0] == major and capability[1] >= minor


def prebuilt_mismatch(build: dict, here: dict) -> str:
    """Why prebuilt kernels built as `build` says cannot run `here` (this_machine()); '' where they can."""
    for key, what in (("torch", "torch"), ("cuda", "torch's CUDA"), ("python", "Python")):
        if build[key] != here[key]:
            return f"they are built for {what} {build[key]}, this is {what} {here[key]}"
    if build["sources"] != here["sources"]:
        return f"they are built from other kernel sources (hash {build['sources']}, these are {here['sources']})"
    if not any(runs_on(arch, here["capability"]) for arch in build["archs"]):
        major, minor = here["capability"]
        return f"they are built for GPU architectures {';'.join(build['archs'])}, not this GPU's {major}.{minor}"
    return ""


def _fitting_prebuilt() -> tuple[Path | None, str]:
    """(folder, what for) of installed prebuilt kernels that fit this machine, else (None, why not)."""
    spec = importlib.util.find_spec(PREBUILT)
    if spec is None or spec.origin is None:
        return None, "no prebuilt kernels are installed"
    folder = Path(spec.origin).parent
    try:
        build = json.loads((folder / BUILD_INFO).read_text())
    except (OSError, ValueError) as exc:
        return None, f"the prebuilt kernels in {folder} have no readable {BUILD_INFO} ({exc})"
    try:
        why = prebuilt_mismatch(build, this_machine())
    except (KeyError, TypeError, ValueError) as exc:  # a build.json of another shape
        return None, f"the prebuilt kernels in {folder} have a {BUILD_INFO} that does not say what they fit ({exc!r})"
    if why:
        return None, f"the prebuilt kernels in {folder} do not fit: {why}"
    return folder, (f"prebuilt for torch {build['torch']} with CUDA {build['cuda']}, GPU architectures "
                    f"{';'.join(build['archs'])} ({folder})")


def _prebuilt():
    """(module, what for) of installed prebuilt kernels that fit this machine and load, else (None, why not)."""
    folder, where = _fitting_prebuilt()
    if folder is None:
        return None, where
    try:
        return importlib.import_module(f"{PREBUILT}._C"), where
    except ImportError as exc:  # such as a C library older than the build machine's
        return None, f"the prebuilt kernels in {folder} do not load ({exc})"


def _has_nvcc() -> bool:
    """Whether torch's extension build finds a CUDA toolkit with nvcc."""
    from torch.utils.cpp_extension import CUDA_HOME  # lazy: it imports setuptools and the compiler's tooling
    return CUDA_HOME is not None and shutil.which("nvcc", path=str(Path(CUDA_HOME) / "bin")) is not None


def _built_here(why_not_prebuilt: str):
    """(module, where from) built from the sources with nvcc (cached); raises SplatwrightError where it cannot."""
    if not _has_nvcc():
        raise SplatwrightError(f"{why_not_prebuilt}, and no CUDA toolkit (nvcc) is found to build them")
    from torch.utils.cpp_extension import load
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with building(directory):
            module = load(name="splatwright_cuda", sources=[str(CUDA_DIR / s) for s in SOURCES],
                          extra_cflags=CXX_FLAGS, extra_cuda_cflags=CUDA_FLAGS, extra_include_paths=[str(CUDA_DIR)],
                          build_directory=str(directory), verbose=False)
    except Exception as exc:  # the message holds the compiler's output
        raise SplatwrightError(f"{why_not_prebuilt}, and building them in {directory} failed:\n{exc}") from exc
    return module, f"built here with nvcc ({directory})"


def extension():
    """The kernels' module, loaded (or built) on first call. Raises SplatwrightError where it cannot be had; a
    failure is kept, and raised again at once by later calls."""
    global _ext, _ext_origin, _failure
    if _ext is not None:  # loaded: no lock on every call of a training step
        return _ext
    with _ext_lock:
        if _ext is None:
            if _failure is not None:
                raise SplatwrightError(_failure)
            if not torch.cuda.is_available():
                raise SplatwrightError("the CUDA kernels need a CUDA GPU, and torch sees none")
            module, where = _prebuilt()
            try:
                _ext, _ext_origin = (module, where) if module is not None else _built_here(where)
            except SplatwrightError as exc:
                _failure = f"the CUDA kernels are not available: {exc}"
                raise SplatwrightError(_failure) from exc
    return _ext


def origin() -> str:
    """Where the loaded kernels came from ('' before they are loaded)."""
    return _ext_origin


def handles(t: torch.Tensor) -> bool:
    """Whether the kernels do the work on `t`: a CUDA tensor, unless they failed to load in this process (then
    torch does it, on the GPU)."""
    return t.is_cuda and _failure is None


def fallback_note() -> str:
    """One line for a run on the GPU without the kernels, saying why it is slow ('' unless they failed)."""
    if _failure is None:
        return ""
    return (f"{_failure.splitlines()[0].rstrip(':')}; so the GPU trains through the torch reference rasterizer, "
            "many times slower (Set Up Backend installs prebuilt kernels where they fit, or install the CUDA "
            "toolkit's nvcc to build them)")


@contextlib.contextmanager
def building(directory: Path):
    """Holds the build directory for this process (other processes wait), and removes the lock file torch's
    build leaves behind when a process is killed while building: torch would wait for it forever. The hold is
    an flock, which the system releases when its process dies; where there is none (Windows), only torch's own
    lock is taken."""
    if fcntl is None:
        yield
        return
    with open(directory / "build.flock", "w") as hold:
        fcntl.flock(hold, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)  # no other process of ours is in a build: stale
            yield
        finally:
            fcntl.flock(hold, fcntl.LOCK_UN)


def is_available(build: bool = True) -> tuple[bool, str]:
    """(True, device name and where the kernels came from) if a CUDA device is present and the kernels load,
    else (False, why not). With build=False, kernels that would be built with nvcc count as available unbuilt
    (their first use builds them); prebuilt ones load, and a missing toolkit fails, at once."""
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    if not build and _ext is None and _failure is None and _fitting_prebuilt()[0] is None and _has_nvcc():
        return True, f"{torch.cuda.get_device_name()}; kernels to be built at first use with nvcc"
    try:
        extension()
    except SplatwrightError as exc:
        return False, str(exc)
    return True, f"{torch.cuda.get_device_name()}; kernels {_ext_origin}"
