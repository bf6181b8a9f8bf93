"""The splat formats against the other tools themselves, run from npm where it is installed (each test skips
saying why elsewhere): Niantic's SPZ library (@adobe/spz 0.2.3, the WebAssembly build of nianticlabs/spz),
PlayCanvas's splat-transform 3.10.2 and GaussianSplats3D 0.4.7's .ksplat writer. The files they wrote for the
fixtures in tests/data/splats (SOURCES.md there) came from these same runs; tests/test_formats.py and
tests/test_spz.py check those where npm is missing. Tolerances: tests/format_helpers.py's."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from backend import formats
from backend.formats import spz
from backend.formats.ply import read_ply
from backend.gaussians import Gaussians
from format_helpers import DATA, KSPLAT_TOL, SPZ_TOL, assert_within, flip_yz, nearest, splat_transform_ply
from helpers import ROOT

TOOLS = {"@adobe/spz": "0.2.3", "@playcanvas/splat-transform": "3.10.2", "@mkkellogg/gaussian-splats-3d": "0.4.7"}
SCRIPTS = ROOT / "tests" / "interop"  # spz.mjs and ksplat.mjs
CACHE = Path.home() / ".cache" / "splatwright"


@pytest.fixture(scope="module")
def tools() -> Path:
    """A folder with the tools installed from npm (once per version set) and our scripts beside them."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.skip("needs node and npm, to install the other tools from the npm registry")
    key = hashlib.sha256(json.dumps(TOOLS, sort_keys=True).encode()).hexdigest()[:12]
    folder = CACHE / f"npm-tools-{key}"
    if not (folder / "node_modules" / ".package-lock.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund",
                            *[f"{name}@{version}" for name, version in TOOLS.items()]],
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            pytest.skip(f"npm could not install {', '.join(TOOLS)}: {r.stderr.strip().splitlines()[-1:]}")
    for script in SCRIPTS.glob("*.mjs"):  # an ES module finds packages from its own folder up
        shutil.copy2(script, folder / script.name)
    return folder


def node(tools: Path, *args) -> None:
    r = subprocess.run(["node", *map(str, args)], cwd=tools, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def splat_transform(tools: Path, *args) -> None:
    node(tools, tools / "node_modules" / "@playcanvas" / "splat-transform" / "bin" / "cli.mjs", "-q", "-w", "-g",
         "cpu", *args)


# --- a model as Niantic's GaussianCloud (the PLY's axes, RDF) -------------------------------------------------

def cloud_json(g: Gaussians) -> dict:
    """`g` as the arrays of Niantic's GaussianCloud: log scales, quaternions x y z w, opacity logits, SH DC, and
    SH beyond DC coefficient-major with the channel inner."""
    flat = lambda t: t.detach().reshape(-1).tolist()  # noqa: E731
    return {"numPoints": len(g), "shDegree": g.max_sh_degree, "positions": flat(g.means),
            "scales": flat(g.log_scales), "rotations": flat(g.quats[:, [1, 2, 3, 0]]),
            "alphas": flat(g.opacity_logits), "colors": flat(g.sh_dc), "sh": flat(g.sh_rest)}


def cloud_gaussians(d: dict) -> Gaussians:
    """The model of a GaussianCloud's arrays (cloud_json's layout), as Niantic's library decoded them."""
    n = d["numPoints"]
    a = lambda k, *shape: torch.tensor(np.asarray(d[k], np.float32).reshape(n, *shape))  # noqa: E731
    return Gaussians(means=a("positions", 3), log_scales=a("scales", 3), quats=a("rotations", 4)[:, [3, 0, 1, 2]],
                     opacity_logits=a("alphas"), sh_dc=a("colors", 1, 3), sh_rest=a("sh", -1, 3))


def niantic_decode(tools: Path, data: bytes, tmp_path: Path) -> dict:
    (tmp_path / "in.spz").write_bytes(data)
    node(tools, "spz.mjs", "decode", tmp_path / "in.spz", tmp_path / "out.json")
    return json.loads((tmp_path / "out.json").read_text())


# --- SPZ -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", spz.VERSIONS)
def test_niantics_library_decodes_our_spz_to_the_model(tools, tmp_path, version):
    ref = read_ply(DATA / "sh3.ply")
    decoded = niantic_decode(tools, formats.encode_any(ref, "spz", spz_version=version), tmp_path)
    assert_within(ref, cloud_gaussians(decoded), SPZ_TOL)
    systems = [(e["type"] & 0xFFFFFFFF, e["coordinateSystem"]) for e in decoded["extensions"]]
    assert systems == ([(spz.COORDINATE_SYSTEM_RECORD, spz.RUB)] if version == 4 else [])


def test_our_reader_decodes_niantics_version_4(tools, tmp_path):
    ref = read_ply(DATA / "sh3.ply")
    (tmp_path / "cloud.json").write_text(json.dumps(cloud_json(ref)))
    node(tools, "spz.mjs", "encode", tmp_path / "cloud.json", tmp_path / "niantic.spz", 4)
    data = (tmp_path / "niantic.spz").read_bytes()
    assert data[:4] == b"NGSP" and spz.extras(data) == spz.Extras()  # no record: RUB, by the specification
    assert_within(ref, formats.read_any(data, "niantic.spz", spz_axes="rub"), SPZ_TOL)


@pytest.mark.parametrize("version", spz.VERSIONS)
def test_splat_transforms_spz_lines_up_with_its_ply_read_in_ply_axes(tools, tmp_path, version):
    ref = read_ply(DATA / "sh3.ply")
    splat_transform(tools, DATA / "sh3.ply", tmp_path / "st.spz", "--spz-version", version)
    data = (tmp_path / "st.spz").read_bytes()
    assert spz.extras(data) == spz.Extras()  # no record saying so
    assert_within(ref, formats.read_any(data, "st.spz", spz_axes="ply"), SPZ_TOL)
    assert_within(ref, flip_yz(formats.read_any(data, "st.spz", spz_axes="rub")), SPZ_TOL)


def test_splat_transform_shows_our_spz_turned_half_about_x(tools, tmp_path):
    """It reads an SPZ's axes as the PLY's whatever its record says, so our RUB lands turned 180 degrees."""
    ref = read_ply(DATA / "sh3.ply")
    (tmp_path / "ours.spz").write_bytes(formats.encode_any(ref, "spz"))
    splat_transform(tools, tmp_path / "ours.spz", tmp_path / "theirs.ply")
    assert_within(flip_yz(ref), splat_transform_ply(tmp_path / "theirs.ply"), SPZ_TOL)


# --- .ksplat ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0, 1, 2])
def test_gaussian_splats_3d_ksplat_reads_as_its_ply(tools, tmp_path, level):
    ref = read_ply(DATA / "sh3.ply")
    node(tools, "ksplat.mjs", DATA / "sh3.ply", tmp_path / "m.ksplat", level, 2)
    g = formats.read_any(tmp_path / "m.ksplat")
    assert g.max_sh_degree == 2
    assert_within(ref, nearest(ref, g), KSPLAT_TOL[level])
