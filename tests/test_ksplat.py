"""GaussianSplats3D's .ksplat (backend/formats/ksplat.py): files its own writer made (tests/data/splats, see
SOURCES.md there) read as the PLY they were made from, to the format's quantisation, and render like it;
malformed files are refused with one-line messages. Tolerances by compression level: tests/format_helpers.py's."""
from __future__ import annotations

import numpy as np
import pytest

from backend import formats
from backend.formats import ksplat
from backend.formats.ply import read_ply
from blender_addon.core.errors import SplatwrightError
from format_helpers import DATA, KSPLAT_TOL, assert_within, donut_cameras, nearest, render_psnr


@pytest.mark.parametrize("name, level", [("sh3-level0.ksplat", 0), ("sh3.ksplat", 2)])
def test_gaussian_splats_3d_files_read_as_their_ply(name, level):
    ref = read_ply(DATA / "sh3.ply")
    assert formats.detect((DATA / name).read_bytes()[:65536], name) == "ksplat"
    g = formats.read_any(DATA / name)
    assert len(g) == len(ref) and g.max_sh_degree == 2  # .ksplat keeps SH up to degree 2
    assert_within(ref, nearest(ref, g), KSPLAT_TOL[level])


def test_a_real_models_ksplat_reads_and_renders_like_its_ply():
    ref = read_ply(DATA / "donut3k.ply")
    g = formats.read_any(DATA / "donut3k.ksplat")
    assert_within(ref, nearest(ref, g), KSPLAT_TOL[1])
    assert render_psnr(ref, g, donut_cameras(2, 32)) > 40.0


def test_a_ksplat_named_splat_is_read_as_what_it_is(tmp_path):
    (tmp_path / "renamed.splat").write_bytes((DATA / "sh3.ksplat").read_bytes())
    assert len(formats.read_any(tmp_path / "renamed.splat")) == 500


def edited(offset: int, fmt: str, value) -> bytes:
    data = bytearray((DATA / "sh3.ksplat").read_bytes())
    data[offset:offset + np.dtype(fmt).itemsize] = np.array([value], fmt).tobytes()
    return bytes(data)


@pytest.mark.parametrize("data, message", [
    ((DATA / "sh3.ksplat").read_bytes()[:-7], "section 0's 500 splats end past the file's end"),
    ((DATA / "sh3.ksplat").read_bytes() + b"\0" * 5, "5 bytes after the last .ksplat section"),
    (edited(ksplat.HEADER_BYTES + 4, "<u4", 501), "end past the file's end"),  # the section's splats
    (edited(ksplat.HEADER_BYTES + 40, "<u2", 3), "SH degree 3; a .ksplat holds degrees 0-2"),
    (edited(ksplat.HEADER_BYTES + 32, "<u4", 9), "buckets are malformed"),  # full buckets
    (edited(12, "<u4", 10 ** 9), "over the limit"),  # the header's most splats
    (edited(4, "<u4", 60000), "section headers end past the file's end"),
])
def test_malformed_ksplat_files_are_refused_with_their_own_message(tmp_path, data, message):
    (tmp_path / "bad.ksplat").write_bytes(data)
    with pytest.raises(SplatwrightError) as e:
        formats.read_any(tmp_path / "bad.ksplat")
    assert message in str(e.value) and "\n" not in str(e.value)
