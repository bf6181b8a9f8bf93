"""The backend's own Python environment, made from Blender: a venv in the add-on's per-user data folder holding
torch for this machine (a CUDA build where an NVIDIA driver answers, else the CPU build), the backend's other
requirements, which travel in the add-on beside the backend's sources, and the prebuilt CUDA kernels where the
add-on carries a wheel of them that fits that torch. Free of bpy: the preferences pass in the folders and the
Python to build from, and plain pytest checks the rest."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..core.errors import SplatwrightError

SOURCES = "backend_src"  # the add-on's folder with the backend's sources (build_addon.py fills it)
REQUIREMENTS = "requirements.txt"  # in SOURCES: the backend's requirements, torch's line first
KERNELS = "kernels"  # in SOURCES: wheels of the prebuilt CUDA kernels (build_kernels.py), installed where they fit
# build_kernels.py's wheel names: the torch version, its CUDA and the Python the kernels are built for
KERNELS_WHEEL = re.compile(r"splatwright_kernels-(?P<version>[0-9.]+\+torch(?P<torch>[0-9.]+)\.cu(?P<cuda>[0-9]+)"
                           r"\.src[0-9a-f]+)-cp(?P<python>[0-9]+)-cp[0-9]+-linux_x86_64\.whl")
VENV = "venv"  # in the add-on's data folder
SESSIONS = "sessions"  # in the add-on's data folder: the local backend's default workdir
READY = "splatwright-ready.json"  # in the venv, once it checked out complete for the requirements it names
LOG = "setup.log"  # in the add-on's data folder: the whole log of the last set-up
# torch's CUDA builds by the newest CUDA the driver must support, newest first; older drivers get the CPU build.
CUDA_BUILDS = ((13, 0, "cu130"), (12, 8, "cu128"), (12, 6, "cu126"), (11, 8, "cu118"))
CUDA_INDEX = "https://download.pytorch.org/whl/{tag}"
# Imports torch for real (a broken install fails here) and reports the installed versions of the requirements and
# of the prebuilt kernels (None where there are none).
CHECK = ("import json, sys, torch; from importlib.metadata import distributions, version; "
         "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda': torch.version.cuda,"
         " 'packages': {name: version(name) for name in sys.argv[1:]},"
         " 'kernels': next((d.version for d in distributions(name='splatwright_kernels')), None)}))")


def backend_sources(addon_folder: Path) -> Path:
    """The folder whose `backend` and `blender_addon` packages the local backend runs: the one bundled in the
    installed add-on, or, for an add-on run from a source checkout, that checkout."""
    bundled = addon_folder / SOURCES
    return bundled if bundled.is_dir() else addon_folder.parent


def venv_python(venv: Path) -> Path:
    return venv / "Scripts" / "python.exe" if os.name == "nt" else venv / "bin" / "python"


def blender_python(executable: str, base_executable: str | None, prefix: str) -> str:
    """Blender's own Python interpreter: sys.executable in Blender 2.91 and later, or the interpreter a
    virtual environment is made from (sys._base_executable) where the bpy module runs in one; before 2.91
    sys.executable is the blender binary, and the interpreter sits in sys.prefix's bin/."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    bin_dir = Path(prefix) / "bin"
    for candidate in (base_executable, executable, bin_dir / f"python{version}", bin_dir / "python3",
                      bin_dir / "python.exe"):
        if candidate and Path(candidate).name.lower().startswith("python") and Path(candidate).is_file():
            return str(candidate)
    raise SplatwrightError(f"Blender's Python interpreter was not found (sys.executable is {executable}); "
                           "choose a Python 3.11 or later to build the backend's environment from in the "
                           "add-on preferences")


def read_requirements(sources: Path) -> tuple[str, list[str]]:
    """(torch's requirement, the others) from the requirements file bundled with the backend's sources."""
    path = sources / REQUIREMENTS
    try:
        lines = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
    except OSError as e:
        raise SplatwrightError(f"the backend's requirements are missing ({e}); reinstall the add-on from its "
                               "zip") from None
    lines = [line for line in lines if line]
    torch = [line for line in lines if requirement_name(line) == "torch"]
    if len(torch) != 1:
        raise SplatwrightError(f"{path} must name torch once, not {len(torch)} times")
    return torch[0], [line for line in lines if line not in torch]


def requirement_name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower()


def driver_cuda(nvidia_smi_output: str) -> tuple[int, int] | None:
    """The newest CUDA version the NVIDIA driver supports, as nvidia-smi prints it."""
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi_output)
    return (int(found.group(1)), int(found.group(2))) if found else None


def detect_driver_cuda() -> tuple[int, int] | None:
    try:
        run = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return driver_cuda(run.stdout) if run.returncode == 0 else None


@dataclass(frozen=True)
class TorchBuild:
    name: str  # 'CPU' or 'CUDA 12.8'
    pip_args: tuple[str, ...]  # where pip finds it: none for pip's configured index
    why: str  # for the log


def torch_build(cuda: tuple[int, int] | None) -> TorchBuild:
    """torch's CUDA build for the newest CUDA the driver supports, else the CPU build from pip's index."""
    if cuda is None:
        return TorchBuild("CPU", (), "no NVIDIA driver answered nvidia-smi")
    for major, minor, tag in CUDA_BUILDS:
        if cuda >= (major, minor):
            return TorchBuild(f"CUDA {major}.{minor}", ("--index-url", CUDA_INDEX.format(tag=tag)),
                              f"the NVIDIA driver supports CUDA {cuda[0]}.{cuda[1]}")
    return TorchBuild("CPU", (), f"the NVIDIA driver supports only CUDA {cuda[0]}.{cuda[1]}, older than torch's "
                                 "CUDA builds need")


def kernels_wheel(sources: Path, found: dict) -> Path | None:
    """The prebuilt kernels' wheel carried in `sources`/kernels that fits what the check `found` in the venv (its
    torch version, that torch's CUDA, its Python), on Linux x86_64; None where none does."""
    if not found.get("cuda") or (sys.platform, platform.machine()) != ("linux", "x86_64"):
        return None
    want = (found["torch"].split("+")[0], found["cuda"].replace(".", ""), "".join(found["python"].split(".")[:2]))
    for wheel in sorted((sources / KERNELS).glob("*.whl"), reverse=True):
        name = KERNELS_WHEEL.fullmatch(wheel.name)
        if name and (name["torch"], name["cuda"], name["python"]) == want:
            return wheel
    return None


def kernels_report(found: dict, wheel: Path | None) -> str:
    """Which CUDA kernels the backend will use with what the check `found` ('' with torch's CPU build)."""
    if not found.get("cuda"):
        return ""
    if wheel is not None:
        return f"prebuilt ({KERNELS_WHEEL.fullmatch(wheel.name)['version']})"
    return (f"none prebuilt for torch {found['torch']} on Python {found['python']} here: built at first use where the "
            "CUDA toolkit (nvcc) is installed, else the GPU trains through the slower torch rasterizer")


@dataclass(frozen=True)
class Step:
    label: str
    argv: list[str]


def install_steps(base_python: str, venv: Path, sources: Path, torch: TorchBuild, reuse_venv: bool) -> list[Step]:
    """The commands that make `venv` complete: create it (unless `reuse_venv`), install torch, then the rest."""
    torch_requirement, others = read_requirements(sources)
    pip = pip_install(venv)
    create = [] if reuse_venv else [Step("Creating the environment", [base_python, "-m", "venv", "--clear",
                                                                      str(venv)])]
    return create + [
        Step(f"Installing torch ({torch.name} build)", [*pip, torch_requirement, *torch.pip_args]),
        Step(f"Installing {', '.join(requirement_name(r) for r in others)}", [*pip, *others]),
    ]


def pip_install(venv: Path) -> list[str]:
    return [str(venv_python(venv)), "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]


def check_step(venv: Path, sources: Path) -> Step:
    _, others = read_requirements(sources)
    return Step("Checking the environment",
                [str(venv_python(venv)), "-c", CHECK, *(requirement_name(r) for r in others)])


def readiness(venv: Path, sources: Path) -> dict | None:
    """What the last set-up found installed in `venv` (python, torch, cuda, packages), if it checked out
    complete for the requirements bundled now and its Python is still there; else None. Reads files only."""
    try:
        ready = json.loads((venv / READY).read_text())
        current = (sources / REQUIREMENTS).read_text()
    except (OSError, ValueError):
        return None
    if ready.get("requirements") != current or not venv_python(venv).is_file():
        return None
    return ready.get("found")


def child_env(**extra: str) -> dict:
    """The environment for a child Python: Blender's own PYTHONPATH and PYTHONHOME would mislead it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


def spawn(argv: list[str], cwd: Path | None = None, env: dict | None = None,
          stdin: int = subprocess.DEVNULL) -> subprocess.Popen:
    """A child with its stdout and stderr in one text pipe, line-buffered, that never waits for input (`stdin`:
    subprocess.PIPE gives it a pipe that Popen.stdin keeps open and nothing writes to)."""
    return subprocess.Popen(argv, cwd=cwd, env=env or child_env(), stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)


class LogTail:
    """The last lines of a log, for the UI. follow() reads a child's output into it on a daemon thread."""

    def __init__(self, keep: int = 200, on_line: Callable[[str], None] | None = None):
        self._lines: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._on_line = on_line

    def add(self, line: str) -> None:
        line = line.rstrip()
        with self._lock:
            self._lines.append(line)
        if self._on_line:
            self._on_line(line)

    def follow(self, stream) -> None:
        threading.Thread(target=self._read, args=(stream,), name="splatwright-log", daemon=True).start()

    def _read(self, stream) -> None:
        with stream:
            for line in stream:
                self.add(line)

    def last(self, n: int) -> list[str]:
        with self._lock:
            return list(self._lines)[-n:]


class Setup:
    """Makes or completes the backend's environment, `folder`/venv, on a thread, one child process at a time:
    a venv that checked out complete is only checked again, a broken or partial one is completed (pip skips
    what is there), and cancel() kills the running child. Progress, the current step and the log are for the
    UI; the whole log also goes to `folder`/setup.log."""

    def __init__(self, base_python: str, folder: Path, sources: Path,
                 find_cuda: Callable[[], tuple[int, int] | None] = detect_driver_cuda):
        self.venv, self.sources = folder / VENV, sources
        self.log = LogTail(on_line=self._write_line)
        self.step, self.steps = "Starting", 1  # the current step's label, and how many steps there are
        self.done = 0  # steps finished
        self.step_started = time.monotonic()
        self.returncode: int | None = None  # None while running; 0 when the environment is ready
        self.state = "running"  # running, done, failed or cancelled
        self.found: dict = {}  # what the check found installed, once done
        self.process: subprocess.Popen | None = None  # the running child
        self._cancelled = False
        self._lock = threading.Lock()
        folder.mkdir(parents=True, exist_ok=True)
        self._log_file = open(folder / LOG, "w", encoding="utf-8")
        threading.Thread(target=self._run, args=(base_python, find_cuda), name="splatwright-setup",
                         daemon=True).start()

    @property
    def progress(self) -> float:
        return 1.0 if self.state == "done" else self.done / self.steps

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self.process is not None:
                self.process.kill()

    def _write_line(self, line: str) -> None:
        self._log_file.write(line + "\n")
        self._log_file.flush()

    def _run(self, base_python: str, find_cuda) -> None:
        code = 1
        try:
            code = self._install(base_python, find_cuda)
        except (SplatwrightError, OSError, ValueError) as e:
            self.log.add(f"error: {e}")
        finally:  # whatever happened, the set-up ends (a bug's traceback goes to the console)
            self.state = ("cancelled" if self._cancelled else "failed") if code else "done"
            failed_at = f" at '{self.step}' (exit code {code})" if self.state == "failed" else ""
            self.log.add(f"set-up {self.state}{failed_at}")
            self._log_file.close()
            self.returncode = code

    def _install(self, base_python: str, find_cuda) -> int:
        check = check_step(self.venv, self.sources)
        if readiness(self.venv, self.sources) is not None:
            self.log.add(f"{self.venv} was set up before; checking it")
            code, output = self._step(check)
            if code == 0 or self._cancelled:
                return code or self._ready(output)
            self.log.add("the check failed; installing again")
            (self.venv / READY).unlink(missing_ok=True)
        torch = torch_build(find_cuda())
        self.log.add(f"{torch.why}: installing torch's {torch.name} build into {self.venv}")
        steps = install_steps(base_python, self.venv, self.sources, torch, self._runs(venv_python(self.venv)))
        self.steps, self.done = len(steps) + 1, 0
        for step in steps:
            code, _ = self._step(step)
            if code:
                return code
            self.done += 1
        code, output = self._step(check)
        return code or self._ready(output)

    def _ready(self, check_output: list[str]) -> int:
        """Install the prebuilt kernels that fit the torch the check found, unless they are there, and record what
        it found, so a later set-up knows the venv is complete."""
        report = next((line for line in reversed(check_output) if line.startswith("{")), "")
        self.found = json.loads(report)
        wheel = kernels_wheel(self.sources, self.found)
        if wheel is not None and self.found.get("kernels") != KERNELS_WHEEL.fullmatch(wheel.name)["version"]:
            self.steps += 1
            code, _ = self._step(Step("Installing the prebuilt CUDA kernels",
                                      [*pip_install(self.venv), "--no-deps", "--force-reinstall", str(wheel)]))
            if code:
                return code
            self.found["kernels"] = KERNELS_WHEEL.fullmatch(wheel.name)["version"]
        self.found["kernels_report"] = kernels_report(self.found, wheel)
        if self.found["kernels_report"]:
            self.log.add(f"CUDA kernels: {self.found['kernels_report']}")
        (self.venv / READY).write_text(json.dumps({"requirements": (self.sources / REQUIREMENTS).read_text(),
                                                   "found": self.found}, indent=2))
        self.done = self.steps
        self.log.add(f"ready: Python {self.found['python']}, torch {self.found['torch']} in {self.venv}")
        return 0

    def _step(self, step: Step) -> tuple[int, list[str]]:
        """Run one command to its end, unless cancelled: (exit code, its lines of output)."""
        with self._lock:
            if self._cancelled:
                return -1, []
            self.step, self.step_started = step.label, time.monotonic()
            self.log.add(f"== {step.label}")
            self.process = proc = spawn(step.argv)
        output = []
        with proc.stdout:
            for line in proc.stdout:
                self.log.add(line)
                output.append(line.strip())
        code = proc.wait()
        with self._lock:
            self.process = None
        return code, output

    @staticmethod
    def _runs(python: Path) -> bool:
        """Whether the venv's Python starts and has pip (a venv cut short by a cancel may have neither)."""
        try:
            return subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True,
                                  timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
