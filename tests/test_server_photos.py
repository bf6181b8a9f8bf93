"""Structure from motion through the server (protocol: upload_photo, reconstruct, cancel_reconstruction,
fetch_reconstruction and the `reconstruction` events), with `python -m backend serve` as a subprocess on loopback
and the add-on's own upload (logic/reconstruction.py): 16 of the skull's photos, which register in seconds,
uploaded, reconstructed while the server renders a model, and fetched back as a capture the add-on imports;
cancelled; refused over the caps; too few registered."""
from __future__ import annotations

import io
import re
import shutil
import zipfile

import numpy as np
import pytest
from PIL import Image

from blender_addon.core import colmap
from blender_addon.core.cameras import Camera, intrinsics, look_at
from blender_addon.core.client import RemoteError
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.reconstruction import unpack_capture
from blender_addon.logic.reconstruction import Reconstruction, Source, progress_text, source_of, upload
from helpers import ROOT
from server_helpers import ServerProcess, wait_for

pytest.importorskip("pycolmap", reason="pycolmap is not installed (pyproject.toml's dependencies have it)")

SKULL = ROOT / "tests" / "data" / "colmap_skull" / "images"
OVERLAPPING = ["35", "36", "37", "38", "39", "47", "48", "49", "50", "53", "54", "55", "56", "64", "65", "66"]
SPLATS = ROOT / "tests" / "data" / "splats" / "sh3.ply"
MAX_VIEWS = len(OVERLAPPING)
MAX_VIDEO_SECONDS = 2


def ended(client, capture: str) -> tuple[dict, list[dict]]:
    """The reconstruction's last event, and its running ones before it."""
    running = []
    event = wait_for(client, lambda e: e["event"] == "reconstruction" and e["capture"] == capture
                     and (e["state"] != "running" or running.append(e)))
    return event, running


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Source:
    folder = tmp_path_factory.mktemp("skull16")
    for name in OVERLAPPING:
        shutil.copy(SKULL / f"{name}.jpg", folder)
    return source_of(str(folder))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("photos-server") / "work"
    process = ServerProcess(work, "--max-views", str(MAX_VIEWS), "--max-upload-bytes", str(4 << 20),
                            "--max-video-seconds", str(MAX_VIDEO_SECONDS))
    process.workdir = work
    yield process
    process.kill()


@pytest.fixture(scope="module")
def reconstructed(server, photos):
    """The 16 photos uploaded and reconstructed, a render asked for at each progress event of the mapping stage."""
    with server.client() as client:
        client.load_ply(SPLATS.read_bytes(), name="sh3.ply")
        camera = Camera(look_at([0.0, -3.0, 0.5], [0.0, 0.0, 0.0]), intrinsics(40.0, 40.0, 16.0, 16.0), 32, 32)
        sent = []
        assert upload(client, photos, lambda: False, lambda done, total: sent.append((done, total)))
        reply = client.call("reconstruct", capture=photos.capture)
        renders = []

        def running(event) -> bool:
            if event["event"] != "reconstruction":
                return False
            if event["state"] == "running" and event["stage"] == "mapping" and not renders:
                renders.append(client.submit_render(camera))
            events.append(event)
            return event["state"] != "running"
        events = []
        last = wait_for(client, running)
        rendered = renders[0].result(60)
        fetched = client.request("fetch_reconstruction", {"capture": photos.capture})
        return {"sent": sent, "reply": reply, "events": events, "last": last, "rendered": rendered,
                "fetched": fetched}


def test_uploaded_photos_reconstruct_with_progress(reconstructed, photos):
    assert reconstructed["sent"][-1] == (16, 16) and len(reconstructed["sent"]) == 16
    assert reconstructed["reply"] == {"capture": photos.capture, "source": "upload"}
    last = reconstructed["last"]
    assert last["state"] == "finished", last
    assert last["photos"] == 16 and last["registered"] >= 12 and last["points"] > 300
    assert f"registered {last['registered']} of 16 photos" in last["message"]
    events = reconstructed["events"][:-1]
    stages = [e["stage"] for e in events]
    assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == ["features", "matching", "mapping",
                                                                                "undistortion"]
    features = [(e["done"], e["total"]) for e in events if e["stage"] == "features"]
    assert features[0] == (0, 16) and features[-1] == (16, 16) and len(features) > 2  # n/N as it goes
    assert progress_text(events[1]) == (events[1]["done"] / 16, f"Features {events[1]['done']}/16")
    assert progress_text(events[-1]) == (None, "Undistorting")


def test_the_server_renders_while_it_reconstructs(reconstructed):
    rendered = reconstructed["rendered"]
    assert rendered.fields["width"] == 32 and len(rendered.payload) == 32 * 32 * 4


def test_the_capture_made_comes_back_as_a_colmap_capture(reconstructed, tmp_path):
    fetched = reconstructed["fetched"]
    root = unpack_capture(fetched.payload, tmp_path / "capture")
    assert fetched.fields["bytes"] == len(fetched.payload)
    assert sorted(p.name for p in root.iterdir()) == ["images", "sparse"]
    model = colmap.read_model(colmap.capture_folders(root)[1])
    last = reconstructed["last"]
    assert len(model.images) == last["registered"] and len(model.xyz) == last["points"]
    assert {cam.model for cam in model.cameras.values()} <= set(colmap.PINHOLE)
    assert all(colmap.image_path(root / "images", image.name).is_file() for image in model.images.values())
    with zipfile.ZipFile(io.BytesIO(fetched.payload)) as packed:  # what it packs is all it holds, as it is
        held = sorted(p for p in root.rglob("*") if p.is_file())
        assert sorted(packed.namelist()) == sorted(p.relative_to(root).as_posix() for p in held)
        assert all(packed.read(p.relative_to(root).as_posix()) == p.read_bytes() for p in held)


def test_a_reconstruction_is_cancelled(server, photos, tmp_path):
    other = tmp_path / "again"
    other.mkdir()
    for path in photos.files[:3]:  # cancelled after the first photos' features: fewer photos, sooner
        shutil.copy(path, other)
    source = source_of(str(other))
    with server.client() as client:
        assert upload(client, source, lambda: False)
        client.call("reconstruct", capture=source.capture)
        wait_for(client, lambda e: e["event"] == "reconstruction" and e["state"] == "running")
        assert client.call("cancel_reconstruction") == {"running": True}
        event, _ = ended(client, source.capture)
        assert event["state"] == "cancelled" and "cancelled during" in event["message"], event
        with pytest.raises(RemoteError, match="no reconstruction made"):
            client.request("fetch_reconstruction", {"capture": source.capture})


def test_uploads_over_the_caps_are_refused(server, photos, tmp_path):
    with server.client() as client:
        with pytest.raises(RemoteError, match="nothing uploaded; upload the photos"):
            client.call("reconstruct", capture="photos-none")
        for index, name in enumerate(OVERLAPPING):  # as many photos as --max-views allows
            client.request("upload_photo", {"capture": "photos-many", "file": f"{name}.jpg", "first": not index},
                           (SKULL / f"{name}.jpg").read_bytes())
        with pytest.raises(RemoteError, match=r"photos uploaded: 17 is over the cap of 16 views .*--max-views N"):
            client.request("upload_photo", {"capture": "photos-many", "file": "01.jpg"},
                           (SKULL / "01.jpg").read_bytes())
        noise = np.random.default_rng(0).integers(0, 256, (1400, 1400, 3), np.uint8)
        Image.fromarray(noise).save(tmp_path / "big.png")  # about 5.9 MB, over --max-upload-bytes
        with pytest.raises(RemoteError, match=r"bytes uploaded: .* is over the cap of 4,194,304 bytes .*"
                                              r"--max-upload-bytes N"):
            client.request("upload_photo", {"capture": "photos-big", "file": "big.png", "first": True},
                           (tmp_path / "big.png").read_bytes())
        with pytest.raises(RemoteError, match="upload the file again from its start"):
            client.request("upload_photo", {"capture": "photos-big", "file": "x.jpg", "offset": 10}, b"1234")
        with pytest.raises(RemoteError, match="one video or photos, not both"):
            client.request("upload_photo", {"capture": "photos-many", "file": "walk.mp4"}, b"\0" * 16)
        with pytest.raises(ValueError, match="not a plain file name"):  # the client checks it as the server does
            client.request("upload_photo", {"capture": "photos-many", "file": "../escape.jpg"}, b"")
        assert client.call("status")["state"] in ("idle", "finished")  # the connection goes on


def test_a_video_goes_up_in_parts_and_its_length_is_capped(server, tmp_path, monkeypatch):
    av = pytest.importorskip("av", reason="PyAV is not installed (pyproject.toml's dependencies have it)")
    video = tmp_path / "walk.mp4"
    with av.open(str(video), "w") as container:  # 4 s of 64x48 frames, twice the cap
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for index in range(48):
            frame = np.full((48, 64, 3), 5 * index, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    monkeypatch.setattr("blender_addon.logic.reconstruction.UPLOAD_CHUNK_BYTES", 1000)
    source = source_of(str(video))
    with server.client() as client:
        parts = []
        real_request = client.request
        monkeypatch.setattr(client, "request", lambda *args: parts.append(args[1]["offset"]) or real_request(*args))
        assert upload(client, source, lambda: False)
        assert len(parts) == video.stat().st_size // 1000 + 1 and parts[:3] == [0, 1000, 2000]
        uploaded = server.workdir / ".reconstructions" / source.capture / "upload" / "walk.mp4"
        assert uploaded.read_bytes() == video.read_bytes()
        monkeypatch.undo()
        assert client.call("reconstruct", capture=source.capture, rate=4.0)["source"] == "walk.mp4"
        event, _ = ended(client, source.capture)
    assert event["state"] == "failed" and "4 s of video: 4 is over the cap of 2 seconds" in event["message"], event
    assert "--max-video-seconds N" in event["message"]


def test_too_few_registered_photos_end_with_a_line_that_says_what_to_do(server, tmp_path):
    folder = tmp_path / "noise"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for index in range(4):  # random noise: features, but nothing that matches between photos
        Image.fromarray(rng.integers(0, 256, (96, 128, 3), np.uint8)).save(folder / f"{index}.png")
    source = source_of(str(folder / "0.png"))  # a photo chosen: its folder's photos
    assert source.path == folder and not source.video and len(source.files) == 4
    with server.client() as client:
        assert upload(client, source, lambda: False)
        client.call("reconstruct", capture=source.capture)
        event, _ = ended(client, source.capture)
    assert event["state"] == "failed" and "\n" not in event["message"], event
    assert "registered 0 of 4 photos, too few to train on" in event["message"]
    assert "take them closer together" in event["message"]


def test_chosen_photos_and_videos(tmp_path):
    (tmp_path / "walk around.MP4").write_bytes(b"")
    video = source_of(str(tmp_path / "walk around.MP4"))
    assert video.video and video.files == [tmp_path / "walk around.MP4"]
    assert re.fullmatch(r"photos-walk_around-[0-9a-f]{8}", video.capture)
    for camera in ("a", "b"):  # two folders of one name
        (tmp_path / camera / "DCIM").mkdir(parents=True)
        (tmp_path / camera / "DCIM" / "1.jpg").write_bytes(b"")
    assert source_of(str(tmp_path / "a" / "DCIM")).capture != source_of(str(tmp_path / "b" / "DCIM")).capture
    with pytest.raises(SplatwrightError, match="holds no photos"):
        source_of(str(tmp_path))
    with pytest.raises(SplatwrightError, match="choose a folder of photos"):
        source_of(str(tmp_path / "missing"))
    cancelled = upload(None, video, lambda: True)  # cancelled before anything is sent
    assert cancelled is False


def test_a_capture_zip_with_anything_but_stored_files_in_images_or_sparse_is_refused(tmp_path):
    for name, compression in (("../evil.txt", zipfile.ZIP_STORED), ("images/../../evil.txt", zipfile.ZIP_STORED),
                              ("notes.txt", zipfile.ZIP_STORED), ("images/a.jpg", zipfile.ZIP_DEFLATED)):
        data = io.BytesIO()
        with zipfile.ZipFile(data, "w", compression) as packed:
            packed.writestr(name, b"x" * 100)
        with pytest.raises(SplatwrightError, match="no stored file inside images/ or sparse/"):
            unpack_capture(data.getvalue(), tmp_path / "capture")
        assert not (tmp_path / "capture").exists() and not (tmp_path / "evil.txt").exists()
    with pytest.raises(SplatwrightError, match="not a zip"):
        unpack_capture(b"PK not really", tmp_path / "capture")


def test_the_progress_says_each_step(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"")
    (tmp_path / "b.jpg").write_bytes(b"")
    job = Reconstruction(source_of(str(tmp_path)), 2.0)
    assert job.progress(True, False, {}) == (None, "Starting the backend")
    job.stage = "starting"
    assert job.progress(False, True, {}) == (0.0, "Uploading 0/2")
    assert job.progress(False, False, {}) == (None, "Starting structure from motion")
    job.stage = "running"
    event = {"capture": job.source.capture, "state": "running", "stage": "matching", "done": 3, "total": 12}
    assert job.progress(False, False, event) == (0.25, "Matching pairs 3/12")
    assert job.progress(False, False, {**event, "capture": "photos-other"}) == (None, "Starting structure from motion")
    assert progress_text({**event, "stage": "mapping", "done": 5, "total": 16}) == (5 / 16, "Registered 5/16")
