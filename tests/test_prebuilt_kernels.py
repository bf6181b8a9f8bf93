"""Which CUDA kernels the backend uses (backend/kernels.py): the prebuilt wheel where it fits this torch, Python,
GPU and sources; else a build at first use with nvcc; else the GPU through the reference rasterizer, saying why.
On the CPU with stand-ins for the GPU and the build; the wheel itself from build_kernels.py (its writer here, a
real build with nvcc in the slow test)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import pytest
import torch
import torch.utils.cpp_extension

import build_addon
import build_kernels
from backend import kernels, policy
from blender_addon.core.errors import SplatwrightError
from blender_addon.logic.environment import KERNELS, KERNELS_WHEEL, SOURCES

CAPABILITY = (9, 0)


@pytest.fixture
def gpu(monkeypatch):
    """A process that has not loaded the kernels yet, on a machine whose torch sees a 9.0 GPU."""
    monkeypatch.setattr(kernels, "_ext", None)
    monkeypatch.setattr(kernels, "_ext_origin", "")
    monkeypatch.setattr(kernels, "_failure", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: CAPABILITY)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")


def install_prebuilt(folder, monkeypatch, **build) -> None:
    """A stand-in splatwright_kernels package on sys.path: build.json (this machine's, with `build` over it) and
    a module _C."""
    package = folder / kernels.PREBUILT
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_C.py").write_text("PREBUILT = True\n")
    here = kernels.this_machine()
    info = {**{k: here[k] for k in ("torch", "cuda", "python", "sources")}, "archs": ["8.0", "9.0"], **build}
    (package / kernels.BUILD_INFO).write_text(json.dumps(info))
    monkeypatch.syspath_prepend(str(folder))
    for name in (kernels.PREBUILT, f"{kernels.PREBUILT}._C"):
        monkeypatch.delitem(sys.modules, name, raising=False)


def build_here_records(monkeypatch) -> list[str]:
    """Stands in for the build with nvcc: records why it was asked for, and gives a module."""
    asked = []

    def built_here(why_not_prebuilt):
        asked.append(why_not_prebuilt)
        return SimpleNamespace(PREBUILT=False), "built here"
    monkeypatch.setattr(kernels, "_built_here", built_here)
    return asked


@pytest.mark.parametrize("arch, capability, runs", [
    ("8.0", (8, 6), True), ("8.6", (8, 0), False), ("9.0", (10, 0), False), ("12.0+PTX", (12, 1), True),
    ("8.0+PTX", (9, 0), True), ("9.0+PTX", (8, 9), False)])
def test_code_for_an_architecture_runs_on_its_family_and_ptx_on_later_gpus(arch, capability, runs):
    assert kernels.runs_on(arch, capability) is runs


def test_prebuilt_kernels_fit_only_their_torch_cuda_python_sources_and_gpu():
    build = {"torch": "2.13.0", "cuda": "13.0", "python": "3.11", "sources": "abc", "archs": ["8.0", "12.0+PTX"]}
    here = {"torch": "2.13.0", "cuda": "13.0", "python": "3.11", "sources": "abc", "capability": (8, 9)}
    assert kernels.prebuilt_mismatch(build, here) == ""
    assert kernels.prebuilt_mismatch(build, {**here, "capability": (12, 0)}) == ""
    assert "torch 2.13.0, this is torch 2.11.0" in kernels.prebuilt_mismatch(build, {**here, "torch": "2.11.0"})
    assert "torch's CUDA 13.0, this is torch's CUDA 12.8" in kernels.prebuilt_mismatch(build, {**here, "cuda": "12.8"})
    assert "Python 3.11, this is Python 3.13" in kernels.prebuilt_mismatch(build, {**here, "python": "3.13"})
    assert "other kernel sources" in kernels.prebuilt_mismatch(build, {**here, "sources": "def"})
    assert "not this GPU's 10.0" in kernels.prebuilt_mismatch(build, {**here, "capability": (10, 0)})


def test_the_prebuilt_kernels_load_where_they_fit(gpu, tmp_path, monkeypatch):
    install_prebuilt(tmp_path, monkeypatch)
    asked = build_here_records(monkeypatch)
    assert kernels.extension().PREBUILT and asked == []
    assert kernels.origin().startswith("prebuilt for torch") and str(tmp_path) in kernels.origin()
    assert kernels.is_available() == (True, f"a GPU; kernels {kernels.origin()}")
    assert kernels.handles(SimpleNamespace(is_cuda=True)) and policy.resolve_device("auto") == ("cuda", "cuda")


def test_kernels_from_other_sources_are_built_here_instead(gpu, tmp_path, monkeypatch):
    install_prebuilt(tmp_path, monkeypatch, sources="0123456789abcdef")
    asked = build_here_records(monkeypatch)
    assert kernels.extension().PREBUILT is False and kernels.origin() == "built here"
    assert len(asked) == 1 and "do not fit: they are built from other kernel sources" in asked[0]


def test_prebuilt_kernels_that_do_not_load_are_built_here_instead(gpu, tmp_path, monkeypatch):
    install_prebuilt(tmp_path, monkeypatch)
    (tmp_path / kernels.PREBUILT / "_C.py").write_text("raise ImportError('GLIBC_2.34 not found')\n")
    asked = build_here_records(monkeypatch)
    assert kernels.extension().PREBUILT is False
    assert len(asked) == 1 and "do not load (GLIBC_2.34 not found)" in asked[0]


def test_without_prebuilt_kernels_or_nvcc_the_gpu_trains_through_the_reference_saying_why(gpu, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT", "splatwright_kernels_not_installed")
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", None)  # no CUDA toolkit found
    with pytest.raises(SplatwrightError, match="no prebuilt kernels are installed, and no CUDA toolkit .nvcc."):
        kernels.extension()
    asked = build_here_records(monkeypatch)
    with pytest.raises(SplatwrightError, match="no CUDA toolkit"):  # the failure is kept: no second attempt
        kernels.extension()
    assert asked == []
    assert policy.resolve_device("auto") == ("cuda", "reference") == policy.resolve_device("cuda")
    assert not kernels.handles(SimpleNamespace(is_cuda=True))  # optimizer, loss, statistics: torch on the GPU
    note = kernels.fallback_note()
    assert "\n" not in note and "no CUDA toolkit (nvcc)" in note and "torch reference rasterizer" in note
    assert "slower" in note


def fake_toolkit(folder, monkeypatch) -> None:
    """A CUDA toolkit with an nvcc, where torch's extension build looks for one."""
    nvcc = folder / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", str(folder / "cuda"))


def test_a_server_counts_kernels_to_be_built_as_there_and_builds_nothing_before_it_answers(gpu, tmp_path,
                                                                                           monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT", "splatwright_kernels_not_installed")
    fake_toolkit(tmp_path, monkeypatch)

    def load(**_):
        raise AssertionError("built before the server answered")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    assert policy.resolve_device("auto", build=False) == ("cuda", "cuda")
    assert kernels.is_available(build=False) == (True, "a GPU; kernels to be built at first use with nvcc")
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", None)
    assert policy.resolve_device("auto", build=False) == ("cuda", "reference")
    assert "no CUDA toolkit (nvcc)" in kernels.fallback_note()


def test_a_failed_build_is_reported_with_the_compilers_output(gpu, tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "PREBUILT", "splatwright_kernels_not_installed")
    monkeypatch.setenv("SPLATWRIGHT_EXT_CACHE", str(tmp_path))
    fake_toolkit(tmp_path, monkeypatch)

    def load(**_):
        raise RuntimeError("error: identifier 'x' is undefined")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    with pytest.raises(SplatwrightError, match="(?s)and building them in .* failed:\nerror: identifier"):
        kernels.extension()
    assert kernels.fallback_note().startswith("the CUDA kernels are not available: no prebuilt kernels are "
                                              "installed, and building them in")


def test_the_wheel_says_what_it_was_built_for_and_pip_installs_it(tmp_path):
    module = tmp_path / "_C.so"
    module.write_bytes(b"\x7fELF stand-in")
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = {"torch": "2.13.0", "cuda": "13.0", "python": python, "archs": ["9.0"],
             "sources": kernels.sources_hash(), "nvcc": "13.0"}
    wheel = build_kernels.write_wheel(tmp_path / "dist", module, ".cpython-311-x86_64-linux-gnu.so", build)
    name = KERNELS_WHEEL.fullmatch(wheel.name)
    assert name and (name["torch"], name["cuda"], name["python"]) == ("2.13.0", "130", python.replace(".", ""))
    with zipfile.ZipFile(wheel) as z:
        assert json.loads(z.read(f"{kernels.PREBUILT}/{kernels.BUILD_INFO}")) == build
    if sys.platform == "linux":
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(tmp_path / "site"), str(wheel)], check=True)
        installed = tmp_path / "site" / kernels.PREBUILT
        assert (installed / "_C.cpython-311-x86_64-linux-gnu.so").read_bytes() == module.read_bytes()
        assert json.loads((installed / kernels.BUILD_INFO).read_text()) == build


def test_the_add_on_carries_the_kernels_wheels_it_is_given(tmp_path):
    wheel = tmp_path / "splatwright_kernels-0.1.0+torch2.13.0.cu130.src0123456789abcdef-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    with zipfile.ZipFile(build_addon.build(tmp_path / "dist", [wheel])) as z:
        assert z.read(f"{build_addon.PACKAGE}/{SOURCES}/{KERNELS}/{wheel.name}") == b"wheel"
    with pytest.raises(SystemExit, match="not wheels of the prebuilt kernels"):
        build_addon.build(tmp_path / "dist", [tmp_path / "torch-2.13.0-cp311-cp311-linux_x86_64.whl"])


def test_architectures_become_nvcc_targets():
    assert build_kernels.gencode(["8.6", "12.0+PTX"]) == [
        "-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120"]


PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
PINNED_TORCH = build_kernels.PYPROJECT["tool"]["splatwright"]["torch"]
PINNED_TORCH_UNPACKED = (build_kernels.DEFAULT_CACHE / f"torch-{PINNED_TORCH}-cp{PYTHON.replace('.', '')}"
                         / "done").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH; building the kernels' wheel needs it")
@pytest.mark.skipif(not PINNED_TORCH_UNPACKED,
                    reason=f"torch {PINNED_TORCH}'s CUDA wheel is not in the kernels' build cache: the real build is "
                           "checked where `python build_kernels.py` has fetched it once (about 600 MB from PyPI)")
def test_the_wheel_builds_for_one_architecture(tmp_path):
    """The real build against the pinned torch, unpacked in the build cache."""
    wheel, = build_kernels.build(PINNED_TORCH, [PYTHON], ["9.0"], tmp_path, build_kernels.DEFAULT_CACHE)
    with zipfile.ZipFile(wheel) as z:
        build = json.loads(z.read(f"{kernels.PREBUILT}/{kernels.BUILD_INFO}"))
        module = next(n for n in z.namelist() if n.startswith(f"{kernels.PREBUILT}/_C."))
        assert b"PyInit__C" in z.read(module)
    assert build["sources"] == kernels.sources_hash() and build["archs"] == ["9.0"] and build["python"] == PYTHON
