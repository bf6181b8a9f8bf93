"""The backend's environment as Set Up Backend makes it (blender_addon/logic/environment.py, no bpy): the torch build
for the machine, the commands, the readiness check, progress, cancel and re-runs. The job runs against a
stand-in Python that records its calls; the real venv and pip run in tests/test_addon_install.py."""
from __future__ import annotations

import json
import platform
import sys
import time
import tomllib
from pathlib import Path

import pytest

import build_addon
from blender_addon.logic import environment as env
from blender_addon.core.errors import SplatwrightError

REPO = Path(__file__).resolve().parent.parent
NVIDIA_SMI = """+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.86.10              Driver Version: 570.86.10      CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+"""
# A Python as far as Set Up Backend uses one: venv makes a copy of it, pip installs after a pause of
# FAKE_PIP_SECONDS (or fails for FAKE_PIP_FAIL), and the check prints its report (a CPU torch, or FAKE_FOUND's
# entries over it). Every call goes to FAKE_CALLS.
FAKE_PYTHON = """#!{python}
import json, os, shutil, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if args[:2] == ["-m", "venv"]:
    os.makedirs(os.path.join(args[-1], "bin"), exist_ok=True)
    shutil.copy(__file__, os.path.join(args[-1], "bin", "python"))
elif args[:3] == ["-m", "pip", "install"]:
    print("Collecting " + " ".join(a for a in args[3:] if not a.startswith("-")), flush=True)
    time.sleep(float(os.environ.get("FAKE_PIP_SECONDS", "0")))
    if os.environ.get("FAKE_PIP_FAIL") in args:
        sys.exit("ERROR: No matching distribution found")
    print("Successfully installed")
elif args[0] == "-c":
    print(json.dumps({{"python": "3.11.9", "torch": "2.13.0+cpu", "cuda": None,
                       "packages": {{name: "1.0" for name in args[2:]}}, "kernels": None,
                       **json.loads(os.environ.get("FAKE_FOUND", "{{}}"))}}))
"""


@pytest.fixture
def sources(tmp_path) -> Path:
    """A folder of backend sources with the requirements the build writes."""
    folder = tmp_path / "backend_src"
    folder.mkdir()
    (folder / env.REQUIREMENTS).write_text(build_addon.requirements())
    return folder


@pytest.fixture
def fake_python(tmp_path, monkeypatch) -> Path:
    python = tmp_path / "base" / "python3.11"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))
    return python


def calls(tmp_path) -> list[list[str]]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def finished(job: env.Setup, timeout: float = 60.0) -> env.Setup:
    deadline = time.monotonic() + timeout
    while job.returncode is None:
        assert time.monotonic() < deadline, f"the set-up did not end: {job.log.last(10)}"
        time.sleep(0.02)
    return job


def no_gpu():
    return None


def test_torch_build_follows_the_nvidia_driver():
    assert env.driver_cuda(NVIDIA_SMI) == (12, 8)
    assert env.driver_cuda("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver") is None
    cuda = env.torch_build((12, 8))
    assert cuda.name == "CUDA 12.8" and cuda.pip_args == ("--index-url", "https://download.pytorch.org/whl/cu128")
    assert env.torch_build((13, 2)).pip_args[-1].endswith("/cu130")
    assert env.torch_build((12, 7)).pip_args[-1].endswith("/cu126")  # the newest build the driver runs
    for cuda in (None, (11, 2)):  # no driver, or one too old: the CPU build from pip's own index
        build = env.torch_build(cuda)
        assert build.name == "CPU" and build.pip_args == ()
    assert "older" in env.torch_build((11, 2)).why and "nvidia-smi" in env.torch_build(None).why


def test_requirements_come_from_the_bundled_file(sources, tmp_path):
    torch, others = env.read_requirements(sources)
    pinned = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["splatwright"]["torch"]
    assert torch == f"torch=={pinned}"
    assert [env.requirement_name(r) for r in others] == ["numpy", "ninja", "plyfile", "pillow", "pycolmap", "zstandard"]
    with pytest.raises(SplatwrightError, match="reinstall the add-on"):
        env.read_requirements(tmp_path / "nowhere")
    (sources / env.REQUIREMENTS).write_text("numpy\n")
    with pytest.raises(SplatwrightError, match="must name torch once"):
        env.read_requirements(sources)


def test_install_steps_make_the_venv_then_torch_then_the_rest(sources, tmp_path):
    venv = tmp_path / "venv"
    python = str(env.venv_python(venv))
    steps = env.install_steps("/opt/python3.11", venv, sources, env.torch_build((12, 8)), reuse_venv=False)
    assert [s.label for s in steps] == ["Creating the environment", "Installing torch (CUDA 12.8 build)",
                                        "Installing numpy, ninja, plyfile, pillow, pycolmap, zstandard"]
    assert steps[0].argv == ["/opt/python3.11", "-m", "venv", "--clear", str(venv)]
    assert steps[1].argv[:4] == [python, "-m", "pip", "install"]
    assert steps[1].argv[-3:] == [env.read_requirements(sources)[0], "--index-url",
                                  "https://download.pytorch.org/whl/cu128"]
    others = env.read_requirements(sources)[1]
    assert steps[2].argv[-len(others):] == others
    reused = env.install_steps("/opt/python3.11", venv, sources, env.torch_build(None), reuse_venv=True)
    assert [s.label for s in reused] == ["Installing torch (CPU build)",
                                         "Installing numpy, ninja, plyfile, pillow, pycolmap, zstandard"]


def test_blenders_python_is_found_even_where_sys_executable_is_blender(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("blender", f"python{sys.version_info.major}.{sys.version_info.minor}"):
        (bin_dir / name).write_text("")
    blender, python = (str(p) for p in sorted(bin_dir.iterdir()))
    assert env.blender_python(python, python, "/nowhere") == python
    assert env.blender_python(sys.executable, python, "/nowhere") == python  # a venv's Python: its base
    assert env.blender_python(blender, blender, str(tmp_path)) == python  # before 2.91: sys.prefix/bin
    with pytest.raises(SplatwrightError, match="choose a Python"):
        env.blender_python(blender, None, str(tmp_path / "empty"))


def test_the_backend_runs_from_its_bundled_sources_or_this_checkout(tmp_path):
    assert env.backend_sources(REPO / "blender_addon") == REPO  # the add-on run from a source checkout
    (tmp_path / "splatwright" / env.SOURCES).mkdir(parents=True)
    assert env.backend_sources(tmp_path / "splatwright") == tmp_path / "splatwright" / env.SOURCES


def test_set_up_creates_installs_checks_and_is_then_ready(fake_python, sources, tmp_path):
    folder = tmp_path / "data"
    assert env.readiness(folder / env.VENV, sources) is None
    job = finished(env.Setup(str(fake_python), folder, sources, find_cuda=no_gpu))
    assert (job.state, job.returncode, job.progress) == ("done", 0, 1.0), job.log.last(20)
    venv_python = str(env.venv_python(folder / env.VENV))
    torch, others = env.read_requirements(sources)
    assert calls(tmp_path) == [
        ["-m", "venv", "--clear", str(folder / env.VENV)],
        ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", torch],
        ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", *others],
        ["-c", env.CHECK, "numpy", "ninja", "plyfile", "pillow", "pycolmap", "zstandard"]]
    assert calls(tmp_path) and Path(venv_python).is_file()
    found = env.readiness(folder / env.VENV, sources)
    assert found == job.found and found["torch"] == "2.13.0+cpu" and set(found["packages"]) == {
        "numpy", "ninja", "plyfile", "pillow", "pycolmap", "zstandard"}
    log = (folder / env.LOG).read_text().splitlines()
    assert log[0].startswith("no NVIDIA driver answered nvidia-smi: installing torch's CPU build")
    assert "== Installing torch (CPU build)" in log and log[-1] == "set-up done"
    assert job.log.last(2) == log[-2:]

    (tmp_path / "calls.jsonl").unlink()
    again = finished(env.Setup(str(fake_python), folder, sources, find_cuda=no_gpu))
    assert again.state == "done" and again.steps == 1
    assert [c[0] for c in calls(tmp_path)] == ["-c"]  # a complete environment is only checked again

    (sources / env.REQUIREMENTS).write_text(build_addon.requirements() + "tqdm\n")  # a newer add-on needs more
    assert env.readiness(folder / env.VENV, sources) is None


KERNELS_VERSION = "0.1.0+torch2.13.0.cu130.src0123456789abcdef"
CUDA_TORCH = {"python": "3.11.9", "torch": "2.13.0+cu130", "cuda": "13.0"}


def carry_kernels(sources: Path) -> Path:
    """Wheels of prebuilt kernels in the add-on: for torch 2.13.0 with CUDA 13.0 and 12.8 on Python 3.11, and
    with CUDA 13.0 on 3.13; returns the first."""
    (sources / env.KERNELS).mkdir()
    names = [f"splatwright_kernels-{KERNELS_VERSION}-cp311-cp311-linux_x86_64.whl",
             "splatwright_kernels-0.1.0+torch2.13.0.cu128.src0123456789abcdef-cp311-cp311-linux_x86_64.whl",
             f"splatwright_kernels-{KERNELS_VERSION}-cp313-cp313-linux_x86_64.whl"]
    for name in names:
        (sources / env.KERNELS / name).write_bytes(b"")
    return sources / env.KERNELS / names[0]


@pytest.mark.skipif((sys.platform, platform.machine()) != ("linux", "x86_64"),
                    reason="the prebuilt kernels are for Linux x86_64")
def test_the_carried_kernels_that_fit_the_installed_torch_are_chosen(sources):
    wheel = carry_kernels(sources)
    assert env.kernels_wheel(sources, CUDA_TORCH) == wheel
    assert env.kernels_wheel(sources, {**CUDA_TORCH, "python": "3.13.1"}).name.endswith("-cp313-cp313-linux_x86_64.whl")
    assert "cu128" in env.kernels_wheel(sources, {**CUDA_TORCH, "torch": "2.13.0+cu128", "cuda": "12.8"}).name
    for other in ({"cuda": "12.6", "torch": "2.13.0+cu126"}, {"torch": "2.12.0+cu130"}, {"python": "3.12.3"},
                  {"cuda": None, "torch": "2.13.0+cpu"}):
        assert env.kernels_wheel(sources, {**CUDA_TORCH, **other}) is None, other
    assert env.kernels_report(CUDA_TORCH, wheel) == f"prebuilt ({KERNELS_VERSION})"
    assert "built at first use where the CUDA toolkit (nvcc) is installed, else the GPU trains through the slower " \
           "torch rasterizer" in env.kernels_report(CUDA_TORCH, None)
    assert env.kernels_report({**CUDA_TORCH, "cuda": None}, None) == ""


@pytest.mark.skipif((sys.platform, platform.machine()) != ("linux", "x86_64"),
                    reason="the prebuilt kernels are for Linux x86_64")
def test_set_up_installs_the_carried_kernels_that_fit_once(fake_python, sources, tmp_path, monkeypatch):
    wheel = carry_kernels(sources)
    monkeypatch.setenv("FAKE_FOUND", json.dumps(CUDA_TORCH))
    folder = tmp_path / "data"
    job = finished(env.Setup(str(fake_python), folder, sources, find_cuda=lambda: (13, 0)))
    assert (job.state, job.progress) == ("done", 1.0), job.log.last(20)
    assert calls(tmp_path)[-1] == ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-deps",
                                   "--force-reinstall", str(wheel)]
    found = env.readiness(folder / env.VENV, sources)
    assert found["kernels"] == KERNELS_VERSION and found["kernels_report"] == f"prebuilt ({KERNELS_VERSION})"
    assert f"CUDA kernels: prebuilt ({KERNELS_VERSION})" in (folder / env.LOG).read_text().splitlines()

    (tmp_path / "calls.jsonl").unlink()  # set up again, the kernels in place: only checked
    monkeypatch.setenv("FAKE_FOUND", json.dumps({**CUDA_TORCH, "kernels": KERNELS_VERSION}))
    again = finished(env.Setup(str(fake_python), folder, sources, find_cuda=lambda: (13, 0)))
    assert again.state == "done" and [c[0] for c in calls(tmp_path)] == ["-c"]


def test_cancel_kills_the_installer_and_the_next_set_up_goes_on(fake_python, sources, tmp_path, monkeypatch):
    folder = tmp_path / "data"
    monkeypatch.setenv("FAKE_PIP_SECONDS", "120")
    job = env.Setup(str(fake_python), folder, sources, find_cuda=lambda: (12, 8))
    deadline = time.monotonic() + 30
    while not (job.step.startswith("Installing torch") and job.log.last(1)[0].startswith("Collecting")):
        assert time.monotonic() < deadline, job.log.last(10)
        time.sleep(0.02)
    installer = job.process
    assert job.progress == 0.25  # the venv made, torch, the rest and the check to go
    job.cancel()
    finished(job, timeout=30)
    assert job.state == "cancelled" and job.returncode != 0 and installer.poll() is not None
    assert job.log.last(1) == ["set-up cancelled"] and env.readiness(folder / env.VENV, sources) is None
    assert len(calls(tmp_path)) == 2  # nothing ran after the cancel

    monkeypatch.setenv("FAKE_PIP_SECONDS", "0")
    (tmp_path / "calls.jsonl").unlink()
    again = finished(env.Setup(str(fake_python), folder, sources, find_cuda=lambda: (12, 8)))
    assert again.state == "done"
    made = calls(tmp_path)
    assert made[0] == ["-m", "pip", "--version"]  # the venv is there and works: reused, not made again
    assert made[1][-2:] == ["--index-url", "https://download.pytorch.org/whl/cu128"]


def test_a_failed_install_says_where(fake_python, sources, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_PIP_FAIL", "ninja")
    job = finished(env.Setup(str(fake_python), tmp_path / "data", sources, find_cuda=no_gpu))
    assert job.state == "failed" and job.returncode == 1
    assert "ERROR: No matching distribution found" in job.log.last(3)
    assert job.log.last(1) == [
        "set-up failed at 'Installing numpy, ninja, plyfile, pillow, pycolmap, zstandard' (exit code 1)"]
    assert env.readiness(tmp_path / "data" / env.VENV, sources) is None


def test_a_missing_base_python_fails_the_set_up_with_its_error(sources, tmp_path):
    job = finished(env.Setup(str(tmp_path / "no-python"), tmp_path / "data", sources, find_cuda=no_gpu))
    assert job.state == "failed" and any("no-python" in line for line in job.log.last(3)), job.log.last(3)
