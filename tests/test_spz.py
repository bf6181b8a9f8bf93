"""SPZ versions 4 and 3 (backend/formats/spz.py) against files the other tools wrote or decoded (tests/data/splats,
SOURCES.md there; tests/test_format_tools.py runs the tools themselves where npm is installed): our version 4
is the file Niantic's library decoded to the model, theirs reads to its source, splat-transform's lines up with
its PLY in the PLY's axes; the axes a file states win over --spz-axes; convert keeps an SPZ's extension records,
writes version 3 on request and says what it cannot do. Tolerances: tests/format_helpers.py's."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
import torch

from backend import formats
from backend.formats import spz
from backend.formats.ply import encode_ply, read_ply
from backend.gaussians import Gaussians
from backend.tools import cli
from blender_addon.core.errors import SplatwrightError
from format_helpers import DATA, SPZ_TOL, assert_within, flip_yz, splat_transform_ply
from helpers import random_gaussians

pytest.importorskip("zstandard", reason="SPZ version 4 needs the zstandard package")

SAFE_ORBIT = (0xADBE0002, struct.pack("<3f", -0.5, 0.5, 1.0))  # Adobe's safe-orbit camera record


def niantic_decoded(path) -> Gaussians:
    d = np.load(path)
    n = len(d["alphas"])
    t = lambda k, *shape: torch.from_numpy(d[k].reshape(n, *shape))  # noqa: E731
    return Gaussians(means=t("positions", 3), log_scales=t("scales", 3), quats=t("rotations", 4)[:, [3, 0, 1, 2]],
                     opacity_logits=t("alphas"), sh_dc=t("colors", 1, 3), sh_rest=t("sh", -1, 3))


def test_our_version_4_is_the_file_niantics_library_decoded_to_the_model():
    ref = read_ply(DATA / "sh3.ply")
    data = formats.encode_any(ref, "spz")
    assert data == (DATA / "ours-sh3-v4.spz").read_bytes() and data[:4] == b"NGSP"
    assert_within(ref, niantic_decoded(DATA / "ours-sh3-v4.spz.niantic.npz"), SPZ_TOL)
    assert np.load(DATA / "ours-sh3-v4.spz.niantic.npz")["coordinate_system"].tolist() == [spz.RUB]


def test_niantics_version_4_reads_as_its_source_in_rub():
    ref = read_ply(DATA / "sh3.ply")
    assert_within(ref, formats.read_any(DATA / "sh3.niantic-v4.spz", spz_axes="rub"), SPZ_TOL)
    assert_within(ref, flip_yz(formats.read_any(DATA / "sh3.niantic-v4.spz")), SPZ_TOL)  # the default: ply


def test_splat_transforms_version_4_lines_up_with_its_ply_by_default():
    ref = read_ply(DATA / "sh3.ply")
    assert_within(ref, formats.read_any(DATA / "sh3-v4.spz"), SPZ_TOL)
    assert spz.extras((DATA / "sh3-v4.spz").read_bytes()) == spz.Extras()


def test_splat_transform_shows_our_spz_turned_half_about_x():
    ref = read_ply(DATA / "sh3.ply")
    assert_within(flip_yz(ref), splat_transform_ply(DATA / "ours-sh3-v4.spz.splat-transform.ply"), SPZ_TOL)


def test_version_4_says_its_axes_and_version_3_does_not():
    g = random_gaussians(200, seed=11, sh_degree=3)
    v4 = formats.encode_any(g, "spz")
    for axes in spz.AXES:  # the record wins
        assert_within(g, formats.read_any(v4, "m.spz", spz_axes=axes), SPZ_TOL)
    v3 = formats.encode_any(g, "spz", spz_version=3)
    assert_within(g, formats.read_any(v3, "m.spz", spz_axes="rub"), SPZ_TOL)
    assert_within(flip_yz(g), formats.read_any(v3, "m.spz", spz_axes="ply"), SPZ_TOL)
    with pytest.raises(SplatwrightError, match="SPZ axes 'luf': choose ply or rub"):
        formats.read_any(v4, "m.spz", spz_axes="luf")


def with_records(data: bytes, records: list[tuple[int, bytes]], flags: int) -> bytes:
    """A version 4 file `data` (ours) with its records replaced by `records` and its flags by `flags`."""
    magic, version, n, degree, bits, _, streams, toc = spz.NGSP_HEADER.unpack_from(data)
    block = b"".join(struct.pack("<II", kind, len(p)) + p for kind, p in records)
    header = spz.NGSP_HEADER.pack(magic, version, n, degree, bits, flags, streams, spz.NGSP_HEADER.size + len(block))
    return header + block + data[toc:]


def test_an_unspecified_coordinate_system_reads_in_the_axes_asked():
    g = random_gaussians(50, seed=12, sh_degree=1)
    data = with_records(formats.encode_any(g, "spz"), [(spz.COORDINATE_SYSTEM_RECORD, bytes(4))], spz.FLAG_EXTENSIONS)
    assert_within(g, formats.read_any(data, "m.spz", spz_axes="rub"), SPZ_TOL)
    assert_within(flip_yz(g), formats.read_any(data, "m.spz", spz_axes="ply"), SPZ_TOL)


def test_convert_keeps_an_spzs_extension_records_and_antialiasing(tmp_path, capsys):
    g = random_gaussians(60, seed=13, sh_degree=2)
    stated = (spz.COORDINATE_SYSTEM_RECORD, struct.pack("<I", spz.RDF))  # stored as the PLY's axes, and says so
    source = with_records(formats.encode_any(flip_yz(g), "spz"), [SAFE_ORBIT, stated],
                          spz.FLAG_EXTENSIONS | spz.FLAG_ANTIALIASED)
    (tmp_path / "in.spz").write_bytes(source)
    assert_within(g, formats.read_any(tmp_path / "in.spz", spz_axes="rub"), SPZ_TOL)
    assert cli.main(["convert", str(tmp_path / "in.spz"), str(tmp_path / "out.spz")]) == 0
    out = (tmp_path / "out.spz").read_bytes()
    assert spz.extras(out) == spz.Extras(antialiased=True, records=(SAFE_ORBIT,))
    assert_within(g, formats.read_any(out), SPZ_TOL)
    capsys.readouterr()
    assert cli.main(["convert", str(tmp_path / "in.spz"), str(tmp_path / "old.spz"), "--spz-version", "3"]) == 0
    err = capsys.readouterr().err
    assert "1 extension record(s) and the antialiasing flag are left out" in err and "--spz-axes rub" in err
    old = (tmp_path / "old.spz").read_bytes()
    assert old[:2] == spz.GZIP_MAGIC and gzip.decompress(old)[4] == 3 and spz.extras(old) == spz.Extras()
    assert_within(g, formats.read_any(old, "old.spz", spz_axes="rub"), SPZ_TOL)


def test_version_3_records_after_the_columns_are_read():
    g = random_gaussians(40, seed=14, sh_degree=0)
    raw = bytearray(gzip.decompress(formats.encode_any(g, "spz", spz_version=3)))
    raw[14] = spz.FLAG_EXTENSIONS  # the flags byte
    raw += struct.pack("<II", *SAFE_ORBIT[:1], len(SAFE_ORBIT[1])) + SAFE_ORBIT[1]
    assert spz.extras(gzip.compress(bytes(raw))) == spz.Extras(records=(SAFE_ORBIT,))


def test_convert_reads_with_the_axes_asked_and_writes_the_version_asked(tmp_path):
    assert cli.main(["convert", str(DATA / "sh3-v4.spz"), str(tmp_path / "ply.ply")]) == 0
    assert cli.main(["convert", str(DATA / "sh3-v4.spz"), str(tmp_path / "rub.ply"), "--spz-axes", "rub"]) == 0
    ply, rub = read_ply(tmp_path / "ply.ply"), read_ply(tmp_path / "rub.ply")
    assert_within(read_ply(DATA / "sh3.ply"), ply, SPZ_TOL)
    assert torch.allclose(rub.means, ply.means * torch.tensor([1.0, -1, -1]))
    assert cli.main(["convert", str(tmp_path / "ply.ply"), str(tmp_path / "v3.spz"), "--spz-version", "3"]) == 0
    assert (tmp_path / "v3.spz").read_bytes()[:2] == spz.GZIP_MAGIC


def test_convert_says_a_higher_sh_degree_cannot_be_had(tmp_path, capsys):
    (tmp_path / "flat.ply").write_bytes(encode_ply(random_gaussians(30, seed=15, sh_degree=0)))
    assert cli.main(["convert", str(tmp_path / "flat.ply"), str(tmp_path / "out.spz"), "--sh-degree", "3"]) == 0
    err = capsys.readouterr().err
    assert "warning: --sh-degree 3: SH degree 3 cannot be had" in err and "holds SH up to degree 0 only" in err
    assert formats.read_any(tmp_path / "out.spz").max_sh_degree == 0


@pytest.mark.parametrize("name, data, fmt, says", [
    ("model.splat", b"glTF\x02\x00\x00\x00" + bytes(56), "glb", "a .glb whose first chunk is not its JSON"),
    ("model.gltf", b'{"asset": {"version": "2.0"}, "meshes": []}', "gltf", "a glTF without Gaussian splats"),
    ("scene.sog", b"PK\x03\x04" + bytes(60), "sog", "unreadable SOG zip"),
    ("meta.json", b'{"version": 2, "count": 4, "means": {"mins": [0, 0, 0]}}', "sog", "not a SOG's meta.json"),
])
def test_zips_glbs_and_json_go_to_the_sog_and_gltf_readers_which_say_what_is_wrong(tmp_path, name, data, fmt, says):
    (tmp_path / name).write_bytes(data)
    assert formats.detect(data, name) == fmt
    with pytest.raises(SplatwrightError, match=says):
        formats.read_any(tmp_path / name)


@pytest.mark.parametrize("name, data, looks", [
    ("photo.splat", b"\x89PNG\r\n\x1a\n" + bytes(56), "a PNG image"),
    ("photo.jpg", b"\xff\xd8\xff\xe0" + bytes(60), "a JPEG image"),
    ("means_l.webp", b"RIFF\x10\x00\x00\x00WEBPVP8L" + bytes(48), "a WebP image"),
    ("notes.splat", b"splats\n" * 10, "a text file"),
])
def test_files_no_reader_takes_are_refused_naming_what_they_look_like(tmp_path, capsys, name, data, looks):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(SplatwrightError, match="not a splat file Splatwright reads") as e:
        formats.read_any(tmp_path / name)
    assert f"{name}: {looks}" in str(e.value)
    assert cli.main(["convert", str(tmp_path / name), str(tmp_path / "out.ply")]) == 1
    assert looks in capsys.readouterr().err
