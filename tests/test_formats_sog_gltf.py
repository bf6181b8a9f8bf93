"""PlayCanvas's SOG and glTF's KHR_gaussian_splatting: files splat-transform wrote (tests/data/splats, SOURCES.md)
read and render, our writes decode in independent readers (splat-transform for SOG, glTF-Transform and Khronos's
glTF-Validator for .glb; live with npx where it runs), round trips stay within the quantisation, a convert chain
through every new format keeps the picture, and lying or malformed files are refused at once with one line.

Tolerances, per attribute:
- SOG: positions half a 16-bit step of the log-mapped range, times (1 + |v|) (splat-transform's writer truncates:
  a whole step); log scales, SH DC and higher SH half the largest gap between neighbouring codebook entries (for
  SH, where each splat is its own palette entry: at most 65536 splats); opacity 0.5 / 255 (splat-transform's
  writer truncates: 1 / 255); quaternion components: the three stored within half a step of 2 / (255 sqrt 2)
  (truncated: a step), the largest, made from them, within three times that.
- glTF: float32 throughout: exact, log scales within 1e-6 (exp then log), opacity within 1e-6.
"""
from __future__ import annotations

import io
import json
import math
import re
import shutil
import struct
import subprocess
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from backend import formats
from backend.formats import gltf, sog, spz
from backend.formats.budget import Budget
from backend.formats.compressed_ply import morton_order
from backend.formats.ply import encode_ply, read_ply
from backend.gaussians import Gaussians
from backend.placement import placed
from backend.service.saved_models import is_dynamic_file
from backend.tools import cli
from blender_addon.core.bundles import bundled, write_sog_folder
from blender_addon.core.errors import SplatwrightError
from format_helpers import (DATA, assert_refused, assert_within, donut_cameras, nearest, render_psnr, reordered,
                            splat_transform_ply)
from helpers import DONUT, assert_bombs_refused, orbit_cameras, random_gaussians, spz_of_zeros, write_scene

SPLAT_TRANSFORM = "@playcanvas/splat-transform@3.10.2"
QUAT_STEP = 2 / 255 / math.sqrt(2)  # of a stored quaternion component
MIB = 1 << 20


def sog_meta(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return json.loads(z.read("meta.json"))


def book_tol(book, values: torch.Tensor) -> float:
    """The farthest a value of `values` may lie from its nearest codebook entry: half the largest gap between
    entries, or beyond the outermost entries, the distance of the outermost values."""
    book = np.sort(np.asarray(book, np.float64))
    gap = float(np.diff(book).max() / 2) if len(book) > 1 else 0.0
    return max(gap, book[0] - float(values.min()), float(values.max()) - book[-1]) + 1e-6


def sog_tol(meta: dict, ref: Gaussians, truncated: bool = False) -> dict:
    """The largest error SOG's quantisation allows each attribute of `ref`, from its file's meta.json; `truncated`:
    a writer that truncates positions, opacities and rotations (splat-transform's)."""
    span = np.array(meta["means"]["maxs"]) - np.array(meta["means"]["mins"])
    step = 1.0 if truncated else 0.5
    tol = dict(means=span / 65535 * step, log_scales=book_tol(meta["scales"]["codebook"], ref.log_scales),
               sh_dc=book_tol(meta["sh0"]["codebook"], ref.sh_dc), opacity=step / 255 + 1e-6,
               quats=3 * QUAT_STEP * step + 1e-6)
    if "shN" in meta:
        tol["sh_rest"] = book_tol(meta["shN"]["codebook"], ref.sh_rest)
    return tol


GLTF_TOL = dict(means=0.0, quats=2e-7, log_scales=1e-6, opacity=1e-6, sh_dc=0.0, sh_rest=0.0)


def in_gltf_axes(g: Gaussians) -> Gaussians:
    return placed(g, gltf.TO_GLTF)


# --- files splat-transform wrote -------------------------------------------------------------------------

@pytest.mark.parametrize("source, name", [("sh3", "sh3.sog"), ("sh3", "sh3-sog/meta.json"),
                                          ("donut3k", "donut3k.sog")])
def test_splat_transforms_sog_matches_its_source(source, name):
    """Bundled and as a folder; the SOG keeps the PLY's axes. Its SH is a k-means palette: see the render test."""
    ref = read_ply(DATA / f"{source}.ply")
    g = formats.read_any(DATA / name)
    meta = sog_meta(bundled(DATA / name)[0])
    tol = {k: v for k, v in sog_tol(meta, ref, truncated=True).items() if k != "sh_rest"}
    assert_within(ref, nearest(ref, g), tol)


@pytest.mark.parametrize("source", ["sh3", "donut3k"])
def test_splat_transforms_glb_is_its_source_in_gltfs_axes(source):
    """splat-transform writes float attributes in glTF's axes (a half turn about z of the PLY's): read into ours,
    they are the PLY's values."""
    ref = read_ply(DATA / f"{source}.ply")
    assert_within(ref, formats.read_any(DATA / f"{source}.glb"), GLTF_TOL)


def test_splat_transforms_files_render_like_their_source():
    donut = read_ply(DATA / "donut3k.ply")
    cams = donut_cameras(2, 32)
    assert render_psnr(donut, formats.read_any(DATA / "donut3k.sog"), cams) > 45.0
    assert render_psnr(donut, formats.read_any(DATA / "donut3k.glb"), cams) > 90.0
    # random degree-3 SH do not cluster: splat-transform's 256-entry palette keeps less of them
    assert render_psnr(read_ply(DATA / "sh3.ply"), formats.read_any(DATA / "sh3.sog"), orbit_cameras(2, 32, 32)) > 30.0


# --- our writes in independent readers -------------------------------------------------------------------

def test_our_sog_decodes_as_the_file_splat_transform_read():
    ref = read_ply(DATA / "sh3.ply")
    ours = formats.read_any(formats.encode_any(ref, "sog"), "ours.sog")
    kept = formats.read_any(DATA / "ours-sh3.sog")
    for key in Gaussians.names():
        assert torch.equal(getattr(ours, key), getattr(kept, key)), key


def test_splat_transform_decodes_our_sog_within_its_quantisation():
    ref = read_ply(DATA / "sh3.ply")
    ordered = reordered(ref, morton_order(ref.means.numpy()))  # the order we write in
    theirs = splat_transform_ply(DATA / "ours-sh3.sog.splat-transform.ply")
    assert_within(ordered, theirs, sog_tol(sog_meta((DATA / "ours-sh3.sog").read_bytes()), ref))


def test_gltf_transform_reads_our_glb_as_khronos_attributes():
    """glTF-Transform read our .glb (tests/data/splats/read-glb.mjs) to the attributes the extension defines, and
    Khronos's glTF-Validator found nothing wrong but what it does not know: the extension and its attributes."""
    ref = read_ply(DATA / "sh3.ply")
    theirs = np.load(DATA / "ours-sh3.glb.gltf-transform.npz")
    assert int(theirs["mode"]) == 0
    assert sorted(theirs["issues"]) == ["MESH_PRIMITIVE_INVALID_ATTRIBUTE KHR_gaussian_splatting",
                                        "UNSUPPORTED_EXTENSION"]
    n, turned = len(ref), in_gltf_axes(ref)
    torch.testing.assert_close(torch.from_numpy(theirs["POSITION"].reshape(n, 3)), turned.means, rtol=0, atol=0)
    q = torch.from_numpy(theirs["ROTATION"].reshape(n, 4))[:, [3, 0, 1, 2]]
    torch.testing.assert_close(q, turned.quats / turned.quats.norm(dim=1, keepdim=True), rtol=0, atol=1e-7)
    torch.testing.assert_close(torch.from_numpy(theirs["SCALE"].reshape(n, 3)), turned.log_scales.exp())
    torch.testing.assert_close(torch.from_numpy(theirs["OPACITY"]), turned.opacities)
    for degree in range(4):
        for k in range(2 * degree + 1):
            coefficient = turned.sh[:, degree * degree + k]
            torch.testing.assert_close(torch.from_numpy(theirs[f"SH_DEGREE_{degree}_COEF_{k}"].reshape(n, 3)),
                                       coefficient, rtol=0, atol=1e-6)
    assert formats.encode_any(ref, "glb") == (DATA / "ours-sh3.glb").read_bytes()


def npx_splat_transform(*args: str, cwd) -> None:
    """splat-transform run by npx (skipped, saying so, where npx or the package is not there)."""
    if shutil.which("npx") is None:
        pytest.skip("npx is not installed: the live splat-transform check needs Node.js")
    command = ["npx", "--yes", SPLAT_TRANSFORM, "-q", "-w", "-g", "cpu", *args]
    try:
        r = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{SPLAT_TRANSFORM} did not finish in 300 s (npx fetching it offline?)")
    if r.returncode != 0 and ("ENOTFOUND" in r.stderr or "E404" in r.stderr or "network" in r.stderr.lower()):
        pytest.skip(f"npx could not fetch {SPLAT_TRANSFORM}: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr


def test_splat_transform_live_reads_our_sog_and_writes_sog_and_glb_we_read(tmp_path):
    g = random_gaussians(300, seed=11, sh_degree=2)
    (tmp_path / "ours.sog").write_bytes(formats.encode_any(g, "sog"))
    (tmp_path / "model.ply").write_bytes(encode_ply(g))
    npx_splat_transform("ours.sog", "ours.ply", cwd=tmp_path)
    npx_splat_transform("model.ply", "theirs.sog", cwd=tmp_path)
    npx_splat_transform("model.ply", "theirs.glb", cwd=tmp_path)
    ordered = reordered(g, morton_order(g.means.numpy()))
    assert_within(ordered, splat_transform_ply(tmp_path / "ours.ply"),
                  sog_tol(sog_meta((tmp_path / "ours.sog").read_bytes()), g))
    theirs = (tmp_path / "theirs.sog").read_bytes()
    tol = {k: v for k, v in sog_tol(sog_meta(theirs), g, truncated=True).items() if k != "sh_rest"}
    assert_within(g, nearest(g, formats.read_any(tmp_path / "theirs.sog")), tol)
    assert_within(g, formats.read_any(tmp_path / "theirs.glb"), GLTF_TOL)


# --- round trips -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("degree", [0, 1, 3])
def test_sog_round_trips_stay_within_the_quantisation(degree):
    g = random_gaussians(700, seed=4, sh_degree=degree)
    data = formats.encode_any(g, "sog")
    back = formats.read_any(data, "model.sog")
    assert back.max_sh_degree == degree
    assert_within(reordered(g, morton_order(g.means.numpy())), back, sog_tol(sog_meta(data), g))


def test_sog_of_more_splats_than_its_palette_keeps_each_cells_mean():
    """Beyond 65536 splats the SH palette is the means of median-cut cells: every entry is used, and the SH
    error is far below the coefficients' spread."""
    g = random_gaussians(70_000, seed=2, sh_degree=1)
    data = formats.encode_any(g, "sog")
    assert sog_meta(data)["shN"]["count"] == sog.PALETTE
    back = formats.read_any(data, "large.sog")
    ordered = reordered(g, morton_order(g.means.numpy()))
    error = (ordered.sh_rest - back.sh_rest).abs().mean()
    assert error < 0.5 * ordered.sh_rest.std()


@pytest.mark.parametrize("fmt", ["glb", "gltf"])
def test_gltf_round_trips_give_back_the_model(fmt):
    g = random_gaussians(300, seed=5, sh_degree=3)
    assert_within(g, formats.read_any(formats.encode_any(g, fmt), f"model.{fmt}"), GLTF_TOL)


def test_a_sog_folder_is_written_and_read_as_its_meta_json(tmp_path):
    g = random_gaussians(200, seed=6, sh_degree=2)
    assert cli.main(["convert", str(write(tmp_path / "m.ply", g)), str(tmp_path / "out" / "meta.json")]) == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(["meta.json", *[f for files in sog.FILES.values() for f in files]])
    bundle = formats.encode_any(g, "sog")
    for key, value in formats.read_any(tmp_path / "out" / "meta.json").tensors().items():
        assert torch.equal(value, getattr(formats.read_any(bundle, "m.sog"), key)), key
    (tmp_path / "out" / "quats.webp").unlink()
    with pytest.raises(SplatwrightError, match="names quats.webp, which is not beside it"):
        formats.read_any(tmp_path / "out" / "meta.json")


def test_a_gltf_reads_its_buffers_beside_it_from_a_path_and_says_so_from_bytes(tmp_path):
    g = random_gaussians(50, seed=7, sh_degree=1)
    doc = json.loads(formats.encode_any(g, "gltf"))
    uri = doc["buffers"][0]["uri"]
    (tmp_path / "model data.bin").write_bytes(gltf.base64.b64decode(uri.partition(",")[2]))
    doc["buffers"][0]["uri"] = "model%20data.bin"
    (tmp_path / "model.gltf").write_text(json.dumps(doc))
    assert_within(g, formats.read_any(tmp_path / "model.gltf"), GLTF_TOL)
    with pytest.raises(SplatwrightError, match="buffer 0 is the separate file 'model%20data.bin'"):
        formats.read_any((tmp_path / "model.gltf").read_bytes(), "model.gltf")
    doc["buffers"][0]["uri"] = "../elsewhere.bin"
    (tmp_path / "model.gltf").write_text(json.dumps(doc))
    with pytest.raises(SplatwrightError, match="not a file beside the .gltf"):
        formats.read_any(tmp_path / "model.gltf")


def glb_with(g: Gaussians, edit=None, binary_edit=None) -> bytes:
    """A .glb of `g` whose JSON `edit` changed, or its JSON and binary chunk `binary_edit`."""
    doc, binary = gltf._document(g)
    doc["buffers"] = [{"byteLength": len(binary)}]
    if edit:
        edit(doc)
    if binary_edit:
        binary = bytearray(binary)
        binary_edit(doc, binary)
        binary = bytes(binary)
    text = json.dumps(doc).encode()
    text += b" " * (-len(text) % 4)
    return (struct.pack("<4sII", b"glTF", 2, 28 + len(text) + len(binary))
            + struct.pack("<II", len(text), gltf.JSON_CHUNK) + text
            + struct.pack("<II", len(binary), gltf.BIN_CHUNK) + binary)


def test_a_gltf_nodes_transform_places_its_splats():
    g = random_gaussians(80, seed=8, sh_degree=2)
    turn = [0.0, math.sin(0.3), 0.0, math.cos(0.3)]  # x, y, z, w: 0.6 rad about glTF's y

    def moved(doc):
        doc["nodes"] = [{"children": [1], "translation": [0.5, -1.0, 2.0]},
                        {"mesh": 0, "rotation": turn, "scale": [2, 2, 2]}]
    back = formats.read_any(glb_with(g, moved), "moved.glb")
    c, s = math.cos(0.6), math.sin(0.6)
    m = np.eye(4)
    m[:3, :3] = 2.0 * np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    m[:3, 3] = [0.5, -1.0, 2.0]
    expected = placed(g, gltf.TO_GLTF @ m @ gltf.TO_GLTF)  # the node's transform, in our axes
    assert_within(expected, back, {**GLTF_TOL, "means": 1e-5, "quats": 1e-6, "sh_rest": 1e-5})


def test_a_gltf_primitive_compressed_as_spz_is_read_by_the_spz_reader():
    """KHR_gaussian_splatting_compression_spz_2: an SPZ packed from glTF's axes (LUF) is what our SPZ writer
    makes of the model in ours."""
    g = random_gaussians(120, seed=9, sh_degree=3)
    packed = spz.encode(g)
    n = len(g)

    def compressed(doc):
        doc["buffers"] = [{"byteLength": len(packed),
                           "uri": "data:application/octet-stream;base64," + gltf.base64.b64encode(packed).decode()}]
        doc["bufferViews"] = [{"buffer": 0, "byteLength": len(packed)}]
        doc["accessors"] = [{"componentType": gltf.FLOAT, "count": n, "type": "VEC3"}]
        primitive = doc["meshes"][0]["primitives"][0]
        primitive["attributes"] = {"POSITION": 0}
        primitive["extensions"]["KHR_gaussian_splatting"]["extensions"] = {
            "KHR_gaussian_splatting_compression_spz_2": {"bufferView": 0}}
    back = formats.read_any(glb_with(g, compressed), "spz.glb")
    expected = formats.read_any(packed, "the SPZ")
    for key in ("means", "log_scales", "opacity_logits", "sh_dc"):
        torch.testing.assert_close(getattr(back, key), getattr(expected, key), rtol=0, atol=1e-5)
    torch.testing.assert_close(back.sh_rest, expected.sh_rest, rtol=0, atol=1e-5)


def test_formats_are_recognised_by_content_not_by_name(tmp_path):
    g = random_gaussians(30, seed=3, sh_degree=1)
    for fmt, misleading in [("sog", "model.ply"), ("glb", "model.spz"), ("gltf", "model.splat"),
                            ("spz", "model.glb"), ("ply", "model.sog")]:
        (tmp_path / misleading).write_bytes(formats.encode_any(g, fmt))
        assert formats.detect((tmp_path / misleading).read_bytes(), misleading) == fmt
        assert len(formats.read_any(tmp_path / misleading)) == 30


def test_a_sog_meta_json_sent_alone_is_refused_saying_where_its_images_are():
    with pytest.raises(SplatwrightError, match="a SOG's meta.json alone; its images are files beside it"):
        formats.read_any(json.dumps(sog_meta(formats.encode_any(random_gaussians(5), "sog"))).encode(), "meta.json")


def test_a_sog_bundle_is_not_taken_for_a_4d_models_torch_zip():
    g = random_gaussians(30, seed=3, sh_degree=0)
    assert not is_dynamic_file(formats.encode_any(g, "sog"), "upload.sog")
    assert not is_dynamic_file(formats.encode_any(g, "sog"), "")


# --- convert chain, render, train --init ------------------------------------------------------------------

def write(path, g: Gaussians):
    path.write_bytes(encode_ply(g))
    return path


def convert_chain(src, tmp_path) -> Gaussians:
    steps = [src, tmp_path / "a.sog", tmp_path / "b.glb", tmp_path / "c.spz", tmp_path / "d.ply"]
    for a, b in zip(steps, steps[1:]):
        assert cli.main(["convert", str(a), str(b)]) == 0
    header = spz.NGSP_HEADER.unpack_from((tmp_path / "c.spz").read_bytes())
    assert (header[0], header[1]) == (spz.MAGIC, 4)  # the SPZ step writes version 4, the default
    return read_ply(steps[-1])


def test_convert_chain_through_sog_glb_and_spz_keeps_the_picture(tmp_path):
    g = random_gaussians(600, seed=9, sh_degree=3)
    back = convert_chain(write(tmp_path / "model.ply", g), tmp_path)
    assert back.max_sh_degree == 3
    assert render_psnr(g, back, orbit_cameras(8, 48, 48)) >= 35.0


@pytest.mark.skipif(not DONUT.is_file(), reason=f"needs the shared third-party PLY {DONUT}")
def test_convert_chain_through_sog_glb_and_spz_keeps_the_picture_of_a_real_model(tmp_path):
    donut = read_ply(DONUT)
    part = reordered(donut, np.arange(0, len(donut), 16))  # the reference renderer is slow on all 45k
    back = convert_chain(write(tmp_path / "donut.ply", part), tmp_path)
    assert render_psnr(part, back, donut_cameras(8, 48)) >= 35.0


def test_render_and_train_init_read_sog_and_glb(tmp_path):
    model = random_gaussians(120, seed=1, sh_degree=1)
    write_scene(tmp_path / "scene", model, orbit_cameras(3, 16, 16))
    (tmp_path / "init.sog").write_bytes(formats.encode_any(model, "sog"))
    (tmp_path / "init.glb").write_bytes(formats.encode_any(model, "glb"))
    assert cli.main(["render", str(tmp_path / "init.glb"),
                     "--cameras", str(tmp_path / "scene" / "transforms_train.json"), "--out", str(tmp_path / "views"),
                     "--device", "cpu"]) == 0
    assert len(list((tmp_path / "views").glob("*.png"))) == 3
    assert cli.main(["train", str(tmp_path / "scene"), "--out", str(tmp_path / "out"), "--iters", "2",
                     "--device", "cpu", "--init", str(tmp_path / "init.sog")]) == 0
    assert len(read_ply(tmp_path / "out" / "splats.ply")) == 120


def test_the_server_imports_sog_and_glb_uploads(tmp_path, start_server):
    g = random_gaussians(40, seed=2, sh_degree=1)
    server = start_server(tmp_path / "work")
    with server.client() as client:
        for name, fmt in (("scan.sog", "sog"), ("scan.glb", "glb")):
            reply = client.load_ply(formats.encode_any(g, fmt), (1.0, 1.0, 1.0), name)
            assert reply["gaussians"] == 40 and reply["sh_degree"] == 1
        reply = client.request("export_ply", {"name": "out.sog"})
        assert reply.fields["format"] == "sog" and len(formats.read_any(bytes(reply.payload), "out.sog")) == 40


# --- lying and malformed files ---------------------------------------------------------------------------

def sog_bundle(meta_edit=None, images: dict | None = None, g: Gaussians | None = None) -> bytes:
    """A bundled SOG of a small model, its meta.json changed by `meta_edit` and images replaced by `images`."""
    members = sog.encode_members(g or random_gaussians(40, seed=0, sh_degree=1))
    meta = json.loads(members["meta.json"])
    if meta_edit:
        meta_edit(meta)
    members.update(images or {})
    members["meta.json"] = json.dumps(meta).encode()
    return zip_of(members)


def zip_of(members: dict) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, content in members.items():
            z.writestr(name, content)
    return out.getvalue()


def webp(width: int, height: int, alpha: int = 255) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (width, height), (0, 0, 0, alpha)).save(out, "WEBP", lossless=True)
    return out.getvalue()


def sets(**values):
    def edit(meta):
        for path, value in values.items():
            target = meta
            *parents, key = path.split("__")
            for parent in parents:
                target = target[int(parent) if isinstance(target, list) else parent]
            if value is None:
                target.pop(key)
            else:
                target[key] = value
    return edit


def glb_edit(**values) -> bytes:
    return glb_with(random_gaussians(20, seed=0, sh_degree=0), sets(**values))


def bombs() -> dict[str, tuple[bytes, str]]:
    """Small SOG and glTF files that declare far more than they hold, and what each one's refusal says."""
    huge = Image.new("RGBA", (16000, 16000))
    big = io.BytesIO()
    huge.save(big, "WEBP", lossless=True)
    return {
        "count.sog": (sog_bundle(sets(count=10_000_000)), "10,000,000 splats declared in"),
        "too_many.sog": (sog_bundle(sets(count=10 ** 12)), "over the limit of 50,000,000"),
        "image.sog": (sog_bundle(images={"sh0.webp": big.getvalue()}), "sh0.webp declares more than 89,478,485 texels"),
        "accessors.glb": (glb_edit(accessors__0__count=40_000_000), "run past its bufferView"),
        "too_many.glb": (glb_edit(accessors__0__count=10 ** 12), "over the limit of 50,000,000"),
        "spz_inside.glb": (glb_with(random_gaussians(20, seed=0, sh_degree=0),
                                    spz_edit(spz_of_zeros(10_000_000, 4 * MIB))), "10,000,000 splats declared in"),
    }


def spz_edit(packed: bytes):
    def edit(doc):
        doc["buffers"] = [{"byteLength": len(packed),
                           "uri": "data:application/octet-stream;base64," + gltf.base64.b64encode(packed).decode()}]
        doc["bufferViews"] = [{"buffer": 0, "byteLength": len(packed)}]
        doc["meshes"][0]["primitives"][0]["extensions"]["KHR_gaussian_splatting"]["extensions"] = {
            "KHR_gaussian_splatting_compression_spz_2": {"bufferView": 0}}
        doc["meshes"][0]["primitives"][0]["attributes"] = {}
    return edit


def test_sog_and_gltf_bombs_are_refused_at_once_by_the_cli_with_little_memory(tmp_path):
    assert_bombs_refused(bombs(), tmp_path, 200 * MIB)


def tagged_quats(members: dict) -> dict:
    rgba = np.asarray(Image.open(io.BytesIO(members["quats.webp"])).convert("RGBA")).copy()
    rgba[0, 3, 3] = 7
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, "WEBP", lossless=True)
    return {"quats.webp": out.getvalue()}


def one_label_too_many(meta):
    meta["shN"]["count"] = 3


@pytest.mark.parametrize("name, data, message", [
    ("v1.sog", sog_bundle(sets(version=None)), "a SOG of no version (version 1"),
    ("v3.sog", sog_bundle(sets(version=3)), "a SOG of version 3; Splatwright reads version 2"),
    ("nometa.sog", zip_of({"means_l.webp": b""}), "the SOG has no meta.json"),
    ("broken.sog", sog_bundle()[:200], "unreadable SOG zip"),
    ("count.sog", sog_bundle(sets(count=-4)), "count is -4"),
    ("mins.sog", sog_bundle(sets(means__mins=[0, 0])), "means.mins should be a list of 3 finite numbers"),
    ("book.sog", sog_bundle(sets(scales__codebook=[0.0] * 300)), "scales.codebook should be a list of 1 to 256"),
    ("files.sog", sog_bundle(sets(quats__files=[])), "quats should name its 1 image file(s)"),
    ("missing.sog", sog_bundle(sets(quats__files=["nowhere.webp"])), "the SOG has no nowhere.webp"),
    ("small.sog", sog_bundle(images={"scales.webp": webp(2, 2)}), "scales.webp is 2x2; it should hold 40 to"),
    ("large.sog", sog_bundle(images={"scales.webp": webp(1200, 1000)}), "scales.webp is 1200x1000; it should hold"),
    ("notimage.sog", sog_bundle(images={"sh0.webp": b"RIFF0000WEBPjunk"}), "sh0.webp is not a WebP or PNG image"),
    ("short.sog", sog_bundle(sets(scales__codebook=[0.0])), "scales indexes entry"),
    ("palette.sog", sog_bundle(one_label_too_many), "shN_labels names palette entry"),
    ("meta.json", b'{"version": 2, "means": {}}', "not a SOG's meta.json (it names no image files)"),
    ("mode.glb", glb_edit(meshes__0__primitives__0__mode=4), "a splat primitive of mode 4"),
    ("linear.glb", glb_edit(**{"meshes__0__primitives__0__extensions__KHR_gaussian_splatting__colorSpace":
                               "lin_rec709_display"}), "splats of colorSpace 'lin_rec709_display'"),
    ("view.glb", glb_edit(bufferViews__0__byteLength=10 ** 9), "bufferView 0"),
    ("type.glb", glb_edit(accessors__0__type="VEC2"), "POSITION (accessor 0) is of type 'VEC2', not VEC3"),
    ("sparse.glb", glb_edit(accessors__0__sparse={"count": 1}), "is sparse or has no bufferView"),
    ("counts.glb", glb_edit(accessors__2__count=5), "ROTATION has 5 elements, POSITION 20"),
    ("nosplats.glb", glb_edit(meshes__0__primitives__0__extensions={}), "no mesh primitive of its scene has"),
    ("cycle.glb", glb_edit(nodes=[{"children": [0]}]), "its nodes nest deeper than 64"),
    ("version.glb", glb_edit(asset={"version": "1.0"}), "glTF version '1.0'"),
    ("external.gltf", json.dumps({"asset": {"version": "2.0"}, "buffers": [{"uri": "x.bin"}]}).encode(),
     "its buffer x.bin is not beside it"),
    ("truncated.glb", glb_edit()[:-40], "truncated .glb"),
])
def test_malformed_sog_and_gltf_files_are_refused_with_their_own_message(tmp_path, capsys, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    assert_refused(path, message, capsys)


@pytest.mark.parametrize("semantic, value, message", [
    ("SCALE", -0.5, "10 of 10 splats have negative scales"),
    ("OPACITY", 1.5, "10 of 10 splats have opacities outside [0, 1]"),
])
def test_gltf_values_out_of_the_extensions_ranges_are_refused(semantic, value, message):
    def edit(doc, binary):
        view = doc["bufferViews"][doc["meshes"][0]["primitives"][0]["attributes"][gltf.attribute(semantic)]]
        count = view["byteLength"] // 4
        binary[view["byteOffset"]:view["byteOffset"] + view["byteLength"]] = np.full(count, value, "<f4").tobytes()
    with pytest.raises(SplatwrightError, match=re.escape(message)):
        formats.read_any(glb_with(random_gaussians(10, seed=1, sh_degree=0), binary_edit=edit), "bad.glb")


def test_a_quaternion_tag_outside_252_255_is_refused():
    members = sog.encode_members(random_gaussians(40, seed=0, sh_degree=0))
    with pytest.raises(SplatwrightError, match="quats.webp's alpha is 7 at splat"):
        formats.read_any(sog_bundle(images=tagged_quats(members), g=random_gaussians(40, seed=0, sh_degree=0)), "q.sog")


def test_sog_and_gltf_read_against_the_model_size_limit():
    for fmt in ("sog", "glb", "gltf"):
        data = formats.encode_any(random_gaussians(30, sh_degree=1), fmt)
        with pytest.raises(SplatwrightError, match=r"30 splats, over the limit of 20"):
            formats.read_any(data, f"model.{fmt}", budget=Budget(20, "ask"))


def test_a_sog_folder_bundles_and_unbundles_as_the_add_on_sends_and_saves_it(tmp_path):
    g = random_gaussians(60, seed=4, sh_degree=1)
    bundle = formats.encode_any(g, "sog")
    (tmp_path / "scan").mkdir()
    write_sog_folder(tmp_path / "scan" / "meta.json", bundle)
    data, name = bundled(tmp_path / "scan" / "meta.json")
    assert name == "scan.sog" and sog.is_bundle(data)
    with zipfile.ZipFile(io.BytesIO(bundle)) as a, zipfile.ZipFile(io.BytesIO(data)) as b:
        assert {n: a.read(n) for n in a.namelist()} == {n: b.read(n) for n in b.namelist()}
