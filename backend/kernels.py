"""The compiled CUDA extension (the kernels in cuda/: rasterizer, loss, optimizer, densification statistics).

The sources are cuda/ beside the backend package in a checkout and in the add-on's zip (backend_src/cuda), and
the package data backend/cuda/ where the backend is installed (pyproject.toml maps it from cuda/).

It is built at first use with torch.utils.cpp_extension.load (ninja) into a cache directory keyed by a hash of
the sources, the torch version and the target architectures: ~/.cache/splatwright/ext-<hash>, or
$SPLATWRIGHT_EXT_CACHE/ext-<hash>. Architectures come from TORCH_CUDA_ARCH_LIST, else the GPUs present.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
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

_ext = None
_ext_lock = threading.Lock()


def _arch_key() -> str:
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in caps)


def build_dir() -> Path:
    """Cache directory for the current sources, torch version and target architectures."""
    h = hashlib.sha256()
    for path in sorted(CUDA_DIR.glob("*")):
        if path.suffix in (".cu", ".cuh", ".h", ".cpp"):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    h.update(torch.__version__.encode())
    h.update(_arch_key().encode())
    h.update(" ".join(CUDA_FLAGS + CXX_FLAGS).encode())
    root = os.environ.get("SPLATWRIGHT_EXT_CACHE") or Path.home() / ".cache" / "splatwright"
    return Path(root) / f"ext-{h.hexdigest()[:16]}"


def extension():
    """The compiled extension module, built on first call. Raises SplatwrightError if the build fails."""
    global _ext
    if _ext is not None:  # built: no lock on every call of a training step
        return _ext
    with _ext_lock:
        if _ext is None:
            if not torch.cuda.is_available():
                raise SplatwrightError("the CUDA kernels need a CUDA GPU, and torch sees none")
            from torch.utils.cpp_extension import load  # lazy: it imports setuptools and the compiler's tooling
            directory = build_dir()
            directory.mkdir(parents=True, exist_ok=True)
            try:
                with building(directory):
                    _ext = load(name="splatwright_cuda", sources=[str(CUDA_DIR / s) for s in SOURCES],
                                extra_cflags=CXX_FLAGS, extra_cuda_cflags=CUDA_FLAGS,
                                extra_include_paths=[str(CUDA_DIR)], build_directory=str(directory), verbose=False)
            except Exception as exc:  # the message holds the compiler's output
                raise SplatwrightError(f"building the CUDA kernels in {directory} failed:\n{exc}") from exc
    return _ext


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


def is_available() -> tuple[bool, str]:
    """(True, device name) if a CUDA device is present and the extension builds, else (False, why not)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch"
    try:
        extension()
    except SplatwrightError as exc:
        return False, str(exc)
    return True, torch.cuda.get_device_name()
