"""The pytest side of the Blender scenarios: runs a scenario script (scenarios/) in real Blender in a subprocess,
with Blender's user folders of its own, and returns what the scenario reports.

- run_scenario: the bpy module of Blender 4.5 (in .venv, which runs the tests), 5.2 or 5.3 (in .venv-bpy52 and
  .venv-bpy53, on Python 3.13); the scenario prints `RESULT <json>` (kit.report).
- run_window_scenario: Debian's Blender 3.4 in a window on an X display (conftest's xvfb); the scenario writes
  result.json into its --out folder.

A scenario imports the harness as the package `blender`, found through PYTHONPATH (tests/), which the bpy
module's Python and Debian's Blender (the system's Python) both read. The windowed scenarios also import the
backend's window driver (backend.tools.bench.windowed) from the checkout; the others cannot import the checkout's
packages, so the add-on they test is the one installed from the zip.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
# The interpreters with the bpy module of each Blender version tested: bpy 4.5 in .venv, which runs the tests,
# and bpy 5.2 (the LTS) and 5.3 in a Python 3.13 venv each (./run test makes them; no two bpy share a venv).
BPY_PYTHONS = {"4.5": sys.executable, "5.2": str(REPO / ".venv-bpy52" / "bin" / "python"),
               "5.3": str(REPO / ".venv-bpy53" / "bin" / "python")}
BLENDERS = tuple(BPY_PYTHONS)
# Blender draws Gaussian splats itself from 5.3 on, so a model object there is a native one; the scenarios of
# splats the backend draws into the scene (an Empty's) run on the versions before.
NATIVE_SPLATS = tuple(b for b in BLENDERS if tuple(map(int, b.split("."))) >= (5, 3))
STREAMED_SPLATS = tuple(b for b in BLENDERS if b not in NATIVE_SPLATS)
# The bpy module can stall in its own exit (C++ static destructors, after Blender's "Freeing memory after the
# leak detector has run") on a loaded machine after Cycles renders: a scenario whose RESULT line is out is
# given this long to exit, then killed, and the stall reported as a warning, not a failure.
EXIT_GRACE_SECONDS = 30
# The windowed scenarios: Xvfb's screen, which their windows fit in; where their tests keep screenshots; the
# pixels along a viewport region's edges that the tests leave out (the area's outline, rounded corners and corner
# widgets are drawn over them).
SCREEN = (1280, 800)
ARTIFACTS = REPO / "test-artifacts"
EDGE = 12


@functools.cache
def bpy_folder(blender: str) -> Path | None:
    """Where that version's bpy module is installed, or None."""
    python = BPY_PYTHONS[blender]
    if not Path(python).is_file():
        return None
    find = "import importlib.util; spec = importlib.util.find_spec('bpy'); print(spec.origin if spec else '')"
    origin = subprocess.run([python, "-c", find], capture_output=True, text=True).stdout.strip()
    return Path(origin).parent if origin else None


def bpy_python(blender: str) -> str:
    """The interpreter with bpy `blender` (one of BLENDERS); skips the test where it is not installed, with why
    where ./run left the reason in its venv."""
    if bpy_folder(blender) is None:
        venv = Path(BPY_PYTHONS[blender]).parent.parent
        why = venv / ".splatwright-skip"
        pytest.skip(f"the bpy {blender} module is not installed in {venv}: "
                    f"{why.read_text().strip() if why.is_file() else './run test installs it'}")
    return BPY_PYTHONS[blender]


def blender_env(home: Path, *importable: Path, **variables: str) -> dict[str, str]:
    """The environment of a Blender the tests start: Blender's user folders in `home`, the folders `importable`
    as PYTHONPATH where given, and `variables`."""
    env = {**os.environ, "BLENDER_USER_SCRIPTS": str(home / "scripts"), "BLENDER_USER_CONFIG": str(home / "config"),
           "BLENDER_USER_EXTENSIONS": str(home / "extensions"), **variables}
    if importable:
        env["PYTHONPATH"] = os.pathsep.join(map(str, importable))
    return env


def run_scenario(script: Path, home: Path, *args: str, timeout: float = 240, blender: str = "4.5") -> dict:
    """Run a Blender scenario script with the bpy module of version `blender` in a subprocess with its own user
    folders; its RESULT line, and its stderr under "stderr"."""
    python = bpy_python(blender)
    output = {"stdout": [], "stderr": []}
    with subprocess.Popen([python, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=blender_env(home, TESTS), cwd=home) as proc:
        readers = [threading.Thread(target=lambda name=name, stream=stream: output[name].extend(stream), daemon=True)
                   for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr))]
        for reader in readers:
            reader.start()
        deadline, result_seen = time.monotonic() + timeout, False
        while proc.poll() is None and time.monotonic() < deadline:
            if not result_seen and any(line.startswith("RESULT ") for line in list(output["stdout"])):
                result_seen, deadline = True, min(deadline, time.monotonic() + EXIT_GRACE_SECONDS)
            time.sleep(0.1)
        stalled = proc.poll() is None
        if stalled:
            proc.kill()
        for reader in readers:
            reader.join(10)
    stdout, stderr = "".join(output["stdout"]), "".join(output["stderr"])
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    ending = f"stalled: killed after {timeout} s" if stalled else f"exit code {proc.returncode}"
    assert lines, f"the scenario printed no result ({ending}):\n{stdout[-3000:]}\n{stderr[-3000:]}"
    if stalled:
        warnings.warn(f"{script.name}: Blender did not exit within {EXIT_GRACE_SECONDS} s of its result (killed)")
    result = json.loads(lines[-1][len("RESULT "):])
    assert "failure" not in result, result.get("traceback")
    return {**result, "stderr": stderr}


def run_window_scenario(script: Path, home: Path, display: str, window: tuple[int, int], *args: str,
                        options: tuple[str, ...] = (), timeout: float = 240) -> dict:
    """Run a Blender scenario script in Debian's Blender, in a window of size `window` on X display `display`,
    with its own user folders and `options` for Blender; the scenario gets `args` and --out home/out. What it
    wrote into result.json there, and Blender's stderr under "stderr"."""
    out = home / "out"
    run = subprocess.run(["blender", "--factory-startup", *options, "-p", "0", "0", str(window[0]), str(window[1]),
                          "--python", str(script), "--", *args, "--out", str(out)],
                         env=blender_env(home, TESTS, REPO, DISPLAY=display), cwd=home, capture_output=True, text=True,
                         timeout=timeout)
    result_file = out / "result.json"
    assert result_file.is_file(), f"Blender wrote no result (exit code {run.returncode}):\n{run.stdout[-3000:]}\n" \
                                  f"{run.stderr[-3000:]}"
    result = json.loads(result_file.read_text())
    assert "failure" not in result, result.get("traceback")
    return {**result, "stderr": run.stderr}
