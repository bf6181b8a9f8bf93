"""The extension's build directory: a build killed midway does not stop later builds (torch waits forever for
the lock file its build leaves behind)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from backend.kernels import building
from helpers import ROOT

fcntl = pytest.importorskip("fcntl", reason="the build hold is an flock, which this system lacks")


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path):
    (tmp_path / "lock").write_text("")
    with building(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_build_under_way_in_another_process_is_waited_for(tmp_path):
    """The other process's torch lock stays while it holds the directory; ours goes on only once it is done."""
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from backend.kernels import building
        with building(Path({str(tmp_path)!r})):
            (Path({str(tmp_path)!r}) / "lock").write_text("")
            print("holding", flush=True)
            sys.stdin.readline()
            (Path({str(tmp_path)!r}) / "lock").unlink()
    """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "holding"
        with open(tmp_path / "build.flock") as hold:
            with pytest.raises(BlockingIOError):  # held by the other process
                fcntl.flock(hold, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other.stdin.write("\n")
        other.stdin.flush()
        with building(tmp_path):  # waits for the other to finish, then finds no lock
            assert not (tmp_path / "lock").exists()
    finally:
        other.kill()
        other.wait()
