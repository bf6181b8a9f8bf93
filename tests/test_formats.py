"""The splat formats: files made by other tools (tests/data/splats, see SOURCES.md there) read and render, our
writes decode in the other tools' readers, round trips stay within each format's quantisation, `convert`
chains keep the picture, and malformed files are refused with one-line messages.

Tolerances, per attribute (the largest error quantisation allows, and a little float slack):
- SPZ: tests/format_helpers.py's.
- compressed PLY: positions and log scales half a 10-bit step of the model's extent; opacity 0.5 / 255; colour
  half an 8-bit step of the colour range; quaternion components 0.002 (10-bit smallest three); SH 4 / 256.
- .splat: positions and scales exact; opacity and colour 1 / 255 (antimatter15's writer truncates, ours
  rounds); quaternion components 0.01 (8 bits each, then normalised); no SH.
"""
from __future__ import annotations

import gzip
import math
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

from backend.tools import cli
from backend import formats
from backend.formats import compressed_ply, spz
from backend.gaussians import Gaussians
from backend.formats.ply import encode_ply, read_ply
from backend.render import render
from backend.sh import SH_C0, sh_to_rgb
from blender_addon.core.cameras import Camera
from format_helpers import (DATA, SPZ_TOL, assert_refused, assert_within, donut_cameras, flip_yz, nearest, render_psnr,
                            renders, reordered, rgb_of, splat_transform_ply)
from helpers import DONUT, ROOT, orbit_cameras, random_gaussians, write_scene

SPLAT_TOL = dict(means=1e-7, log_scales=1e-5, opacity=1 / 255 + 1e-6, rgb=1 / 255 + 1e-6, quats=0.01)
GRID = [[-1, 0, -1], [0, 0, -1], [-1, 0, 0], [0, 0, 0]]  # the splat-transform fixtures' positions (PLY axes)


def compressed_tol(g: Gaussians) -> dict:
    extent = float((g.means.amax(0) - g.means.amin(0)).max())
    scale_extent = float((g.log_scales.amax(0) - g.log_scales.amin(0)).max())
    rgb = rgb_of(g)
    return dict(means=extent / 2046 + 1e-6, log_scales=scale_extent / 2046 + 1e-5, opacity=0.5 / 255 + 1e-6,
                rgb=float(rgb.max() - rgb.min()) / 510 + 1e-5, quats=0.002, sh_rest=4 / 256 + 1e-5)


# --- files made by other tools --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["minimal-v3.spz", "minimal-v4.spz"])
def test_niantics_spz_files_read_in_the_plys_axes(name):
    """Niantic's library wrote these from RDF (PLY) data into SPZ's RUB, with no record saying so; read as RUB
    they are back in the PLY's axes."""
    if name.endswith("v4.spz"):
        pytest.importorskip("zstandard", reason="SPZ version 4 needs the zstandard package")
    g = formats.read_any(DATA / name, spz_axes="rub")
    assert torch.allclose(g.means, torch.tensor(GRID, dtype=torch.float32), atol=SPZ_TOL["means"])
    assert torch.allclose(g.log_scales, torch.full((4, 3), math.log(0.1)), atol=SPZ_TOL["log_scales"])
    assert torch.allclose(g.opacities, torch.full((4,), 0.9), atol=SPZ_TOL["opacity"])
    expected_rgb = torch.tensor([[1 / 3, 1 / 3, 0.5], [2 / 3, 1 / 3, 0.5], [1 / 3, 2 / 3, 0.5], [2 / 3, 2 / 3, 0.5]])
    assert torch.allclose(g.sh_dc[:, 0], (expected_rgb - 0.5) / SH_C0, atol=SPZ_TOL["sh_dc"])
    assert torch.allclose(g.quats.abs(), torch.tensor([[1.0, 0, 0, 0]] * 4), atol=1e-6)


def test_hand_packed_spz_v2_and_splat_read_by_the_specification():
    g = formats.read_any(DATA / "minimal-v2.spz")  # the PLY's positions packed raw: read in the PLY's axes
    assert torch.allclose(g.means, torch.tensor(GRID, dtype=torch.float32))
    assert torch.allclose(g.log_scales, torch.full((4, 3), 123 / 16 - 10))
    assert torch.allclose(g.quats[:, 1:], torch.full((4, 3), 1 / 255), atol=1e-6)
    turned = formats.read_any(DATA / "minimal-v2.spz", spz_axes="rub")  # as the specification's RUB: y and z flip
    assert torch.allclose(turned.means, g.means * torch.tensor([1.0, -1, -1]))
    s = formats.read_any(DATA / "minimal.splat")
    assert torch.allclose(s.means, torch.tensor(GRID, dtype=torch.float32))
    assert torch.allclose(s.log_scales.exp(), torch.full((4, 3), 0.1))
    assert torch.allclose(s.opacities, torch.full((4,), 230 / 255), atol=1e-5)
    assert torch.allclose(rgb_of(s)[:, 2], torch.full((4,), 128 / 255), atol=1e-5)
    # Rotation bytes (128, 128, 128, 255) are (w, x, y, z) = (0, 0, 0, 127/128), normalised.
    assert torch.allclose(s.quats, torch.tensor([[0.0, 0, 0, 1]] * 4))


@pytest.mark.parametrize("source", ["donut3k", "sh3"])
def test_splat_transforms_files_match_their_source(source):
    ref = read_ply(DATA / f"{source}.ply")
    assert_within(ref, nearest(ref, formats.read_any(DATA / f"{source}.compressed.ply")), compressed_tol(ref))
    # splat-transform stores the PLY's axes in SPZ unconverted, which the default axes (ply) read.
    assert_within(ref, formats.read_any(DATA / f"{source}.spz"), SPZ_TOL)
    if source == "donut3k":
        assert_within(ref, nearest(ref, formats.read_any(DATA / "donut3k.splat")), SPLAT_TOL)


def test_splat_transforms_spz_version_4_matches_its_source():
    pytest.importorskip("zstandard", reason="SPZ version 4 needs the zstandard package")
    assert_within(read_ply(DATA / "sh3.ply"), formats.read_any(DATA / "sh3-v4.spz", spz_axes="ply"), SPZ_TOL)


def test_third_party_files_render_like_their_source():
    cams = donut_cameras(1, 32)
    reference = renders(read_ply(DATA / "donut3k.ply"), cams)
    for name in ["donut3k.compressed.ply", "donut3k.spz", "donut3k.splat", "donut3k.ksplat"]:
        assert render_psnr(reference, formats.read_any(DATA / name), cams) > 33.0, name


# --- our writes in the other tools' readers --------------------------------------------------------------

def test_our_writes_are_the_files_the_other_readers_decoded():
    ref = read_ply(DATA / "sh3.ply")
    assert formats.encode_any(ref, "compressed_ply") == (DATA / "ours-sh3.compressed.ply").read_bytes()
    assert formats.encode_any(ref, "splat") == (DATA / "ours-sh3.splat").read_bytes()
    assert gzip.decompress(formats.encode_any(ref, "spz", spz_version=3)) == gzip.decompress(
        (DATA / "ours-sh3.spz").read_bytes())


def test_niantics_reader_decodes_our_spz_to_the_model():
    """Niantic's own reader, asked for RDF, gives back the model we wrote: our RUB conversion is theirs."""
    ref = read_ply(DATA / "sh3.ply")
    d = np.load(DATA / "ours-sh3.spz.niantic.npz")
    n = len(ref)
    theirs = Gaussians(means=torch.from_numpy(d["positions"].reshape(n, 3)),
                       log_scales=torch.from_numpy(d["scales"].reshape(n, 3)),
                       quats=torch.from_numpy(d["rotations"].reshape(n, 4)[:, [3, 0, 1, 2]]),
                       opacity_logits=torch.from_numpy(d["alphas"]),
                       sh_dc=torch.from_numpy(d["colors"].reshape(n, 1, 3)),
                       sh_rest=torch.from_numpy(d["sh"].reshape(n, 15, 3)))
    assert_within(ref, theirs, SPZ_TOL)


def test_splat_transform_decodes_our_compressed_ply_and_splat():
    ref = read_ply(DATA / "sh3.ply")
    ordered = reordered(ref, compressed_ply.morton_order(ref.means.numpy()))  # the order we write in
    assert_within(ordered, splat_transform_ply(DATA / "ours-sh3.compressed.ply.splat-transform.ply"),
                  compressed_tol(ref))
    theirs = splat_transform_ply(DATA / "ours-sh3.splat.splat-transform.ply")
    assert_within(ref, theirs, {**SPLAT_TOL, "opacity": 0.5 / 255 + 1e-6, "rgb": 0.5 / 255 + 1e-6})


# --- round trips -----------------------------------------------------------------------------------------

def round_trip(g: Gaussians, fmt: str) -> Gaussians:
    return formats.read_any(formats.encode_any(g, fmt), name=f"model.{fmt}")


def test_round_trips_stay_within_the_quantisation():
    g = random_gaussians(700, seed=4, sh_degree=3)  # not a whole number of 256-splat chunks
    assert_within(g, round_trip(g, "spz"), SPZ_TOL)
    assert_within(reordered(g, compressed_ply.morton_order(g.means.numpy())), round_trip(g, "compressed_ply"),
                  compressed_tol(g))
    assert_within(g, round_trip(g, "splat"), {**SPLAT_TOL, "opacity": 0.5 / 255 + 1e-6, "rgb": 0.5 / 255 + 1e-6})
    assert round_trip(g, "splat").max_sh_degree == 0
    assert torch.equal(round_trip(g, "ply").sh_rest, g.sh_rest)


@pytest.mark.parametrize("fmt", ["spz", "splat", "compressed_ply"])
def test_decoded_values_encode_back_to_themselves(fmt):
    g = random_gaussians(300, seed=5, sh_degree=2)
    first = round_trip(g, fmt)
    tol = {"spz": SPZ_TOL, "splat": SPLAT_TOL, "compressed_ply": compressed_tol(first)}[fmt]
    assert_within(first, round_trip(first, fmt), {k: t if k == "dc_limit" else t / 2 for k, t in tol.items()})


def test_spz_columns_but_rotations_encode_back_to_the_same_bytes():
    """Rotations may differ where two components tie for the largest (either choice is the same rotation)."""
    data = gzip.decompress(formats.encode_any(random_gaussians(300, seed=5, sh_degree=2), "spz", spz_version=3))
    again = gzip.decompress(formats.encode_any(formats.read_any(gzip.compress(data), name="m.spz", spz_axes="rub"),
                                               "spz", spz_version=3))
    rotations = slice(16 + 300 * 16, 16 + 300 * 20)
    assert again[:rotations.start] == data[:rotations.start] and again[rotations.stop:] == data[rotations.stop:]


def test_large_scenes_keep_fewer_fractional_bits_in_spz():
    g = random_gaussians(50, seed=6, sh_degree=0)
    g.means = g.means * 5000.0  # beyond 2048, where 12 fractional bits overflow 24-bit positions
    back = round_trip(g, "spz")
    assert gzip.decompress(formats.encode_any(g, "spz", spz_version=3))[13] < 12
    assert (back.means - g.means).abs().max() < 0.5


# --- SPZ's axes ------------------------------------------------------------------------------------------

def test_the_spz_axis_flip_is_a_half_turn_about_x_for_positions_rotations_and_sh():
    g = random_gaussians(40, seed=8, sh_degree=3)
    f = flip_yz(g)
    half_turn = torch.diag(torch.tensor([1.0, -1.0, -1.0]))
    assert torch.allclose(f.means, g.means @ half_turn)
    assert torch.allclose(flip_yz(f).sh_rest, g.sh_rest) and torch.allclose(flip_yz(f).quats, g.quats, atol=1e-6)
    dirs = torch.nn.functional.normalize(torch.randn(40, 3, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert torch.allclose(sh_to_rgb(f.sh, dirs @ half_turn, 3), sh_to_rgb(g.sh, dirs, 3), atol=1e-5)
    # Seen through the same half-turned cameras, the flipped model renders as the model.
    for cam in orbit_cameras(2, 24, 24):
        turned = cam.c2w.copy()
        turned[:3] = np.diag([1.0, -1.0, -1.0]) @ cam.c2w[:3]
        with torch.no_grad():
            a = render(g, cam, 3, (1.0, 1.0, 1.0)).image
            b = render(f, Camera(turned, cam.K, cam.width, cam.height), 3, (1.0, 1.0, 1.0)).image
        assert (a - b).abs().max() < 1e-4


# --- convert ---------------------------------------------------------------------------------------------

def convert_chain(src, tmp_path) -> Gaussians:
    steps = [src, tmp_path / "a.spz", tmp_path / "b.compressed.ply", tmp_path / "c.ply"]
    for a, b in zip(steps, steps[1:]):
        assert cli.main(["convert", str(a), str(b)]) == 0
    return read_ply(steps[-1])


def test_convert_chain_keeps_the_picture(tmp_path):
    g = random_gaussians(600, seed=9, sh_degree=3)
    (tmp_path / "model.ply").write_bytes(encode_ply(g))
    back = convert_chain(tmp_path / "model.ply", tmp_path)
    assert back.max_sh_degree == 3
    assert render_psnr(g, back, orbit_cameras(3, 48, 48)) >= 35.0


@pytest.mark.skipif(not DONUT.is_file(), reason=f"needs the shared third-party PLY {DONUT}")
def test_convert_chain_keeps_the_picture_of_a_real_model(tmp_path):
    donut = read_ply(DONUT)
    part = reordered(donut, np.arange(0, len(donut), 16))  # the reference renderer is slow on all 45k
    (tmp_path / "donut.ply").write_bytes(encode_ply(part))
    back = convert_chain(tmp_path / "donut.ply", tmp_path)
    assert render_psnr(part, back, donut_cameras(2, 24)) >= 35.0


def test_convert_drops_sh_bands_and_says_what_splat_leaves_out(tmp_path, capsys):
    (tmp_path / "model.ply").write_bytes(encode_ply(random_gaussians(50, seed=2, sh_degree=3)))
    assert cli.main(["convert", str(tmp_path / "model.ply"), str(tmp_path / "low.spz"), "--sh-degree", "1"]) == 0
    assert formats.read_any(tmp_path / "low.spz").max_sh_degree == 1
    assert cli.main(["convert", str(tmp_path / "model.ply"), str(tmp_path / "web.splat")]) == 0
    assert "note: .splat holds no SH beyond degree 0" in capsys.readouterr().err


def test_formats_are_recognised_by_content_not_by_name(tmp_path):
    g = random_gaussians(30, seed=3, sh_degree=1)
    for fmt, misleading in [("spz", "model.ply"), ("compressed_ply", "model.spz"), ("ply", "model.compressed.ply")]:
        (tmp_path / misleading).write_bytes(formats.encode_any(g, fmt))
        assert formats.detect((tmp_path / misleading).read_bytes(), misleading) == fmt
        assert len(formats.read_any(tmp_path / misleading)) == 30


def test_render_and_train_init_read_every_format(tmp_path):
    model = random_gaussians(120, seed=1, sh_degree=1)
    write_scene(tmp_path / "scene", model, orbit_cameras(3, 16, 16))
    (tmp_path / "init.spz").write_bytes(formats.encode_any(model, "spz"))
    assert cli.main(["render", str(tmp_path / "init.spz"), "--cameras", str(tmp_path / "scene" / "transforms_train.json"),
                     "--out", str(tmp_path / "views"), "--device", "cpu"]) == 0
    assert len(list((tmp_path / "views").glob("*.png"))) == 3
    assert cli.main(["train", str(tmp_path / "scene"), "--out", str(tmp_path / "out"), "--iters", "2",
                     "--device", "cpu", "--init", str(tmp_path / "init.spz")]) == 0
    trained = read_ply(tmp_path / "out" / "splats.ply")
    assert len(trained) == 120 and trained.max_sh_degree == 3  # bands padded to the configured degree


# --- malformed files -------------------------------------------------------------------------------------

def spz_payload(n: int = 4, version: int = 3, degree: int = 0, extra: bytes = b"", count: int | None = None) -> bytes:
    rotation = 4 if version == 3 else 3
    header = struct.pack("<IIIBBBB", spz.MAGIC, version, n if count is None else count, degree, 12, 0, 0)
    return gzip.compress(header + bytes(n * (16 + rotation + 3 * ((degree + 1) ** 2 - 1))) + extra, mtime=0)


def splat_records(**changes) -> bytes:
    r = np.frombuffer(formats.encode_any(random_gaussians(4, seed=0, sh_degree=0), "splat"), formats.splat.RECORD).copy()
    for field, value in changes.items():
        r[field][1] = value
    return r.tobytes()


def compressed(**edit) -> bytes:
    data = formats.encode_any(random_gaussians(300, seed=0, sh_degree=1), "compressed_ply")
    for old, new in edit.items():
        data = data.replace(old.encode(), new.encode(), 1) if isinstance(new, str) else new(data)
    return data


def nan_chunk(data: bytes) -> bytes:
    start = data.index(b"end_header\n") + len(b"end_header\n")
    return data[:start] + struct.pack("<f", float("nan")) + data[start + 4:]


@pytest.mark.parametrize("name, data, message", [
    ("bad.spz", gzip.compress(b"NOTSPZ" * 10, mtime=0), "gzip data that is not SPZ"),
    ("bad.spz", spz_payload()[:-9], "SPZ's gzip stream is truncated or corrupt"),
    ("bad.spz", spz_payload(count=9), "truncated SPZ: 9 splats need"),
    ("bad.spz", spz_payload(extra=b"\0" * 7), "7 bytes after the columns of 4 splats; the splat count does not match"),
    ("bad.spz", spz_payload(version=1), "SPZ version 1 (float16 positions) is not supported"),
    ("bad.spz", spz_payload(degree=4), "SH degree 4"),
    ("bad.spz", b"NGSP" + bytes(10), "shorter than the 32-byte header"),
    ("bad.compressed.ply", compressed(**{"element chunk 2": "element chunk 3"}), "unreadable PLY"),
    ("bad.compressed.ply", compressed(**{"element chunk 2\n": "element chunk 1\n"}), "the counts do not match"),
    ("bad.compressed.ply", compressed(edit=nan_chunk), "NaN or infinite means"),
    ("bad.compressed.ply", compressed(**{"packed_color": "packed_colour"}), "lacks packed_color"),
    ("bad.splat", splat_records()[:-5], "not a whole number of 32-byte .splat records"),
    ("bad.splat", splat_records(position=[np.nan, 0, 0]), "NaN or infinite means"),
    ("bad.splat", splat_records(scale=[0.0, 1.0, 1.0]), "non-positive scales"),
    ("bad.splat", b"", "empty file"),
    ("bad.bin", b"\x00" * 64, "not a splat file Splatwright reads"),
])
def test_malformed_files_are_refused_with_their_own_message(tmp_path, capsys, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    assert_refused(path, message, capsys)


def test_the_cli_refuses_a_bad_file_without_a_traceback(tmp_path):
    (tmp_path / "bad.spz").write_bytes(spz_payload(count=9))
    r = subprocess.run([sys.executable, "-m", "backend", "convert", str(tmp_path / "bad.spz"), str(tmp_path / "o.ply")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'bad.spz'}: truncated SPZ: 9 splats need")


def test_unknown_output_names_are_refused_before_reading(tmp_path, capsys):
    assert cli.main(["convert", str(tmp_path / "missing.ply"), str(tmp_path / "out.obj")]) == 1
    assert "no splat format has this name" in capsys.readouterr().err
