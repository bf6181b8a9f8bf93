"""The add-on's bpy-free logic, imported from the checkout as Blender imports it from the zip (no bpy here)."""
from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import numpy as np
import pytest

from blender_addon.logic import colors, dataset, defaults, frames, messages, training, undistortion
from blender_addon.core import codecs, protocol, settings
from blender_addon.core.settings import TRAINING, training_settings
from blender_addon.core.cameras import Camera, intrinsics
from blender_addon.core.client import RemoteError
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import REQUESTS
from helpers import ROOT, wait_until
from server_helpers import FakeClient

# ---- capture geometry and the dataset ----

@pytest.mark.parametrize("hemisphere", [False, True])
def test_orbit_poses_look_at_the_centre_from_the_sphere(hemisphere):
    center = np.array([1.0, -2.0, 0.5])
    poses = dataset.orbit_poses(center, 3.0, 40, seed=4, hemisphere=hemisphere)
    assert len(poses) == 40
    eyes = np.array([p[:3, 3] for p in poses])
    np.testing.assert_allclose(np.linalg.norm(eyes - center, axis=1), 3.0)
    forward = np.array([-p[:3, 2] for p in poses])  # Blender cameras look down their -Z
    np.testing.assert_allclose(forward, (center - eyes) / 3.0, atol=1e-9)
    if hemisphere:
        assert np.all(eyes[:, 2] >= center[2])
    else:  # evenly spread: about as many below as above
        assert abs(np.sum(eyes[:, 2] > center[2]) - 20) <= 1
    assert not np.allclose(eyes, [p[:3, 3] for p in dataset.orbit_poses(center, 3.0, 40, 5, hemisphere)])


def test_fitting_distance_keeps_the_bounds_in_view():
    K = intrinsics(100.0, 100.0, 80.0, 60.0)
    d = dataset.fitting_distance(2.0, K, 160, 120, margin=1.0)
    half_fov = math.atan(60.0 / 100.0)  # the narrower (vertical) one
    assert d * math.sin(half_fov) == pytest.approx(2.0)


def test_split_of_holds_out_every_nth_view():
    assert [dataset.split_of(i, 4) for i in range(8)] == ["train"] * 3 + ["test"] + ["train"] * 3 + ["test"]
    assert {dataset.split_of(i, 0) for i in range(10)} == {"train"}
    for count in range(20):
        for every in (0, 1, 3, 8):
            kept = sum(dataset.split_of(i, every) == "train" for i in range(count))
            assert dataset.training_count(count, every) == kept, (count, every)


def test_capture_percentage_keeps_the_longest_side_within_the_limit():
    assert dataset.capture_percentage(1920, 1080, 100, 160) == 8  # 153x86 px
    assert dataset.capture_percentage(1080, 1920, 50, 160) == 8
    assert dataset.capture_percentage(80, 80, 100, 160) == 100  # small scenes are not scaled up
    assert dataset.capture_percentage(1920, 1080, 25, 0) == 25  # no limit
    assert dataset.capture_percentage(100_000, 100, 100, 160) == 1  # never below 1 %



def test_frame_time_spans_the_frame_range():
    assert [dataset.frame_time(f, 10, 30) for f in (10, 15, 30)] == [0.0, 0.25, 1.0]
    assert dataset.frame_time(5, 10, 30) == 0.0 and dataset.frame_time(40, 10, 30) == 1.0  # outside: clamped
    assert dataset.frame_time(7, 7, 7) == 0.0

def test_dataset_writer_and_training_views_round_trip(tmp_path):
    writer = dataset.DatasetWriter(tmp_path)
    cams = [Camera(p @ np.diag([1.0, -1.0, -1.0, 1.0]), intrinsics(50.0, 52.0, 16.0, 12.0), 32, 24)
            for p in dataset.orbit_poses([0, 0, 0], 2.0, 3, 0, True)]
    for i, cam in enumerate(cams):
        writer.image_path("train", f"v{i}").write_bytes(b"png")
        writer.add("train", f"v{i}", cam, time=[0.0, 0.5, None][i])
    writer.write()
    views = dataset.training_views(tmp_path)
    assert [name for name, _, _, _ in views] == ["v0", "v1", "v2"]
    assert [time for _, _, _, time in views] == [0.0, 0.5, None]
    for (_, cam, image, _), original in zip(views, cams):
        np.testing.assert_allclose(cam.c2w, original.c2w, atol=1e-12)
        np.testing.assert_array_equal(cam.K, original.K)
        assert image.is_file()
    (tmp_path / "train" / "v1.png").unlink()
    with pytest.raises(SplatwrightError, match="v1.png is missing"):
        dataset.training_views(tmp_path)


def test_sample_surface_puts_points_on_the_triangles_in_their_colours():
    triangles = np.array([[[0, 0, 0], [1, 0, 0], [0, 1, 0]], [[0, 0, 5], [4, 0, 5], [0, 4, 5]]], dtype=np.float64)
    rgb = np.array([[255, 0, 0], [0, 0, 255]], dtype=np.uint8)
    xyz, colours = dataset.sample_surface(triangles, rgb, 3400, seed=1)
    assert xyz.shape == (3400, 3) and xyz.dtype == np.float32 and colours.shape == (3400, 3)
    on_second = xyz[:, 2] == 5
    assert np.all(on_second | (xyz[:, 2] == 0))
    assert np.all(colours[on_second] == [0, 0, 255]) and np.all(colours[~on_second] == [255, 0, 0])
    assert abs(on_second.mean() - 16 / 17) < 0.02  # by area: 8 against 0.5
    assert np.all(xyz[:, :2] >= 0) and np.all(xyz[~on_second, :2].sum(1) <= 1 + 1e-6)
    empty_xyz, empty_rgb = dataset.sample_surface(np.zeros((0, 3, 3)), np.zeros((0, 3), np.uint8), 10, 0)
    assert empty_xyz.shape == (0, 3) and empty_rgb.shape == (0, 3)


# ---- frames and colours ----

def test_border_rect_truncates_to_pixels_as_blender_does():
    render = SimpleNamespace(use_border=False, border_min_x=0.25, border_max_x=0.75, border_min_y=0.1,
                             border_max_y=0.5)
    assert frames.border_rect(render, 80, 60) == (0, 0, 80, 60)
    render.use_border = True
    assert frames.border_rect(render, 80, 60) == (20, 6, 40, 24)
    render.border_min_x = render.border_max_x = 0.5
    assert frames.border_rect(render, 80, 60)[2] == 1  # never empty


def test_srgb_curve_round_trips_and_bytes_stay_bytes():
    x = np.linspace(0, 1, 1001)
    np.testing.assert_allclose(colors.srgb_to_linear(colors.linear_to_srgb(x)), x, atol=1e-6)
    assert colors.srgb_to_linear(np.array([0.5]))[0] == pytest.approx(0.2140411, abs=1e-6)
    levels = np.arange(256, dtype=np.uint8)
    assert np.array_equal(colors.linear_to_srgb8(colors.srgb_to_linear(levels / 255.0)), levels)
    rgba = np.stack([levels, levels[::-1], levels, np.full(256, 128, np.uint8)], -1).reshape(16, 16, 4)
    np.testing.assert_allclose(colors.display_pixels(rgba), rgba.reshape(-1) / 255.0, rtol=1e-6)
    linear = colors.linear_pixels(rgba).reshape(-1, 4)
    np.testing.assert_allclose(linear[:, :3], colors.srgb_to_linear(rgba.reshape(-1, 4)[:, :3] / 255.0), atol=1e-7)
    np.testing.assert_allclose(linear[:, 3], 128 / 255.0, rtol=1e-6)


def test_a_large_frame_converts_in_pieces_to_every_value_of_one_multiply():
    rgba = np.random.default_rng(3).integers(0, 256, (1080, 1921, 4), dtype=np.uint8)  # not a multiple of a piece
    out = np.full(rgba.size, np.nan, np.float32)
    assert colors.display_pixels(rgba, out) is out
    assert np.array_equal(out, np.multiply(rgba.reshape(-1), np.float32(1.0 / 255.0), dtype=np.float32))


def test_combined_pass_takes_the_background_out_for_a_transparent_film():
    background = [1.0, 1.0, 1.0]
    straight, alpha = np.array([0.2, 0.4, 0.6]), 0.5
    shown = straight * alpha + np.array(background) * (1 - alpha)  # as the backend composites
    rgba = np.array([[[*np.round(shown * 255), round(alpha * 255)]]], dtype=np.uint8)
    opaque = colors.combined_pass(rgba, background, transparent=False)
    np.testing.assert_allclose(opaque[:3], colors.srgb_to_linear(rgba[0, 0, :3] / 255.0))
    assert opaque[3] == 1.0
    clear = colors.combined_pass(rgba, background, transparent=True)
    a = rgba[0, 0, 3] / 255.0
    np.testing.assert_allclose(clear[:3] / a, colors.srgb_to_linear(straight), atol=0.01)
    assert clear[3] == pytest.approx(a)


def test_packed_layer_pixels_keep_every_colour_and_depth_to_2_to_the_minus_15():
    """layer_pixels: every byte of every channel comes back exactly, depths within their stated relative
    error, and the packed values are plain floats (no NaN, infinity or denormal a GPU might alter)."""
    rng = np.random.default_rng(4)
    rgba = np.concatenate([rng.integers(0, 256, (500, 4)), np.repeat(np.arange(256)[:, None], 4, 1)]).astype(np.uint8)
    depth = np.exp(rng.uniform(np.log(1e-3), np.log(1e10), len(rgba))).astype(np.float32)
    packed = codecs.layer_pixels(rgba.reshape(1, -1, 4), depth.reshape(1, -1))
    back, back_depth = codecs.unpacked_layer(packed)
    assert np.array_equal(back, rgba)
    assert np.all(np.abs(back_depth / depth - 1) < 2.0**-15)
    assert np.all(np.isfinite(packed)) and np.all(np.abs(packed[packed != 0]) >= np.finfo(np.float32).tiny)


def test_frame_stream_shows_the_newest_answer_and_says_why_it_has_none():
    client = FakeClient()
    arrived = []
    stream = frames.FrameStream(lambda: client, on_frame=arrived.append)
    cams = [Camera(np.eye(4), intrinsics(10.0, 10.0, 2.0, 2.0), 4, 4 + i) for i in range(3)]
    try:
        stream.ask(cams[0], tag="a")
        wait_until(lambda: len(client.asked) == 1)
        stream.ask(cams[1], tag="b")
        wait_until(lambda: len(client.asked) == 2)
        client.answer(1, value=200)  # the newer answer first: the older one must not replace it
        wait_until(lambda: stream.frame is not None)
        client.answer(0, value=10)
        time.sleep(0.05)
        assert stream.frame.tag == "b" and stream.frame.fields["height"] == 5
        np.testing.assert_allclose(stream.frame.pixels, 200 / 255.0, rtol=1e-6)
        assert [f.tag for f in arrived] == ["b"]
        wait_until(lambda: len(client.released) == 2)
        assert sorted(client.released) == [0, 1]  # shown or not, each frame's shared memory goes back once
        stream.ask(cams[2], tag="c")
        wait_until(lambda: len(client.asked) == 3)
        client.answer(2, error=RemoteError(protocol.REJECTED, "nothing to render yet"))
        wait_until(lambda: stream.error == "nothing to render yet")
        assert stream.frame.tag == "b"  # the last good frame stays
    finally:
        stream.close()
    gone = frames.FrameStream(lambda: None)
    try:
        gone.ask(cams[0])
        wait_until(lambda: gone.error == "the backend is not connected")
    finally:
        gone.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_frame_stream_whose_thread_failed_gives_every_frame_back():
    client = FakeClient()

    def broken_view(frame):
        raise RuntimeError("a view that fails on its first frame")
    stream = frames.FrameStream(lambda: client, on_frame=broken_view)
    try:
        for i in range(2):
            stream.ask(Camera(np.eye(4), intrinsics(10.0, 10.0, 2.0, 2.0), 4, 4 + i), tag=i)
            wait_until(lambda: len(client.asked) == i + 1)
        client.answer(0, value=10)  # prepared, given back, then the view's failure ends the stream's thread
        wait_until(lambda: client.released == [0])
        client.answer(1, value=20)  # nobody left to prepare it: given back at once
        wait_until(lambda: client.released == [0, 1])
    finally:
        stream.close()
        stream._thread.join(10)  # so its exception is reported within this test, whose filter expects it


# ---- training settings ----

def panel(**overrides):
    values = dict(source="ORBIT", preset="QUALITY", custom_steps=False, iterations=7000, sh_degree=3, max_gaussians=0,
                  background="WHITE", background_color=(0.5, 0.5, 0.5))
    return SimpleNamespace(**{**values, **overrides})


def test_where_blender_draws_splats_the_panel_trains_for_its_image_formation():
    checked = REQUESTS["start_training"].fields.check(training.training_fields(panel(), native_splats=True))
    assert checked["image_formation"] == "blender"
    assert REQUESTS["start_training"].fields.check(training.training_fields(panel()))["image_formation"] == "standard"


def test_training_fields_are_start_training_fields():
    fields = training.training_fields(panel())
    assert fields == {"preset": "quality", "sh_degree": 3, "background": [1.0, 1.0, 1.0], "fresh": True}
    checked = REQUESTS["start_training"].fields.check(fields)
    assert checked["iterations"] is None and checked["max_gaussians"] is None  # left to the schedule
    fields = training.training_fields(panel(preset="FAST", custom_steps=True, iterations=150, max_gaussians=900,
                                            background="CUSTOM", background_color=(0.1, 0.2, 0.3)), fresh=False)
    checked = REQUESTS["start_training"].fields.check(fields)
    assert (checked["preset"], checked["iterations"], checked["max_gaussians"]) == ("fast", 150, 900)
    np.testing.assert_allclose(checked["background"], [0.1, 0.2, 0.3])
    assert checked["fresh"] is False and checked["checkpoint_every"] == settings.default("checkpoint_every")
    assert training.background_rgb("BLACK", (0.5, 0.5, 0.5)) == [0.0, 0.0, 0.0]
    assert REQUESTS["start_training"].fields.check(training.training_fields(panel()))["appearance"] == "auto"
    photos = REQUESTS["start_training"].fields.check(training.training_fields(panel(source="PHOTOS")))
    assert photos["appearance"] == "on" and photos["far_field"] == settings.FAR_FIELD_POINTS


def test_training_settings_survive_json():
    chosen = training_settings(iterations=9, checkpoint_every=7)
    assert chosen["checkpoint_every"] == 7 and chosen["preset"] == settings.default("preset")
    assert TRAINING.check(json.loads(json.dumps(chosen))) == chosen
    with pytest.raises(ValueError, match="checkpoint_every"):
        training_settings(checkpoint_every=-1)


# ---- device defaults and estimates ----

def test_device_defaults_cover_the_same_settings_and_are_copies():
    gpu, cpu = defaults.defaults_for("cuda"), defaults.defaults_for("cpu")
    assert gpu.keys() == cpu.keys()
    assert defaults.defaults_for("mps") == cpu and defaults.defaults_for(None) == cpu  # no CUDA: the CPU's
    gpu["orbit_count"] = -1
    assert defaults.defaults_for("cuda")["orbit_count"] == 32
    # The GPU keeps the full-size capture and the preset's schedule; the CPU a small, short preview.
    assert (gpu["resolution_percentage"], gpu["max_side"], gpu["custom_steps"]) == (100, 0, False)
    assert cpu["orbit_count"] <= 16 and 100 <= cpu["max_side"] <= 160 and cpu["point_count"] <= 2000
    assert cpu["custom_steps"] and cpu["render_engine"] == "CYCLES" and 0 < cpu["samples"] <= 32


def test_schedule_steps_are_the_backends():
    policy = pytest.importorskip("backend.policy")
    train = pytest.importorskip("backend.train")
    for preset, cfg in policy.PRESETS.items():
        for views in (1, 100, 160, 400):  # a few views keep the preset's count, many stretch it
            assert defaults.schedule_steps("cuda", preset, None, views) == train.fit_to_views(cfg, views).iterations
    cpu_schedule = policy.make_config("cpu", "reference", training_settings())
    assert defaults.schedule_steps("cpu", "quality", None, 400) == cpu_schedule.iterations
    assert defaults.schedule_steps("cuda", "quality", 123, 400) == 123


def test_cpu_preview_training_estimate_is_under_a_few_minutes():
    cpu = defaults.defaults_for("cpu")
    width, height = 1920 * 8 // 100, 1080 * 8 // 100  # the startup scene's preview views
    seconds = defaults.training_seconds("cpu", cpu["iterations"], width, height)
    assert 20 <= seconds <= 180  # the estimate's own arithmetic, not a timing (bench defaults measured 33 s)
    steps = cpu["iterations"]
    assert defaults.training_seconds("cpu", 2 * steps, width, height) == pytest.approx(2 * seconds)
    assert defaults.training_seconds("cpu", steps, 2 * width, height) > seconds
    assert defaults.training_seconds("cuda", 30_000, 1920, 1080) < 600


def test_messages_are_one_line_and_labels_fit_the_width():
    assert messages.one_line("load ply:\n  not a PLY\tfile ") == "load ply: not a PLY file"
    text = "No local backend process is running; start it with Start Backend in the Backend panel"
    lines = messages.wrap(text, 20)
    assert len(lines) == 4 and lines[-1].endswith(messages.ELLIPSIS)  # cut after max_lines, and says so
    shown = " ".join(lines)[:-1]
    assert all(len(line) <= 20 for line in lines) and text.startswith(shown)
    assert messages.wrap("short", 20) == ["short"] and messages.wrap("", 20) == [""]
    assert messages.wrap("a" * 25, 10, max_lines=3) == ["a" * 10, "a" * 10, "a" * 5]  # a long word is broken


def test_last_error_line_is_the_backends_reason_not_a_warnings_tail():
    log = ["splatwright serve: listening on 127.0.0.1:5000",
           "/venv/torch/nn/functional.py:1234: UserWarning: something is deprecated",
           "  warnings.warn(",
           "error: out of memory: tried to allocate 2.0 GiB; lower the Gaussian cap",
           "  return torch._C._nn.something(x)"]
    assert messages.last_error_line(log) == "error: out of memory: tried to allocate 2.0 GiB; lower the Gaussian cap"
    crash = ["splatwright serve: session a: opened", "Traceback (most recent call last):",
             '  File "backend/engine.py", line 1, in run', "    step()", "RuntimeError: CUDA error: device lost",
             "/venv/torch/cuda/__init__.py:9: UserWarning: no GPU", "  warnings.warn("]
    assert messages.last_error_line(crash) == "RuntimeError: CUDA error: device lost"
    assert messages.last_error_line(["UserWarning: only chatter", "  warnings.warn("]) == ""


def test_a_training_cpu_backend_gets_five_frames_worth_of_time_between_frames():
    assert frames.training_frame_gap(0.0) == frames.CPU_MIN_SECONDS
    assert frames.training_frame_gap(2.0) == 2.0 * frames.FRAME_SHARE_FACTOR
    assert 1 / (1 + frames.FRAME_SHARE_FACTOR) <= 0.2  # frames take at most a fifth of the backend's time


def test_a_frame_stream_lets_another_thread_start_its_own():
    handed = []
    stream = frames.FrameStream(lambda: None, start=handed.append)
    assert len(handed) == 1 and not handed[0].is_alive()  # Thread.start would have waited for it to run
    stream.ask(Camera(np.eye(4), intrinsics(10.0, 10.0, 4.0, 4.0), 8, 8))
    handed[0].start()
    deadline = time.monotonic() + 5
    while not stream.error and time.monotonic() < deadline:
        time.sleep(0.01)
    stream.close()
    assert stream.error == "the backend is not connected"


def test_a_frame_change_hides_a_4d_models_frame_of_another_time_but_not_a_static_ones():
    pytest.importorskip("bpy")
    from types import SimpleNamespace

    from blender_addon.render.engine import LiveView
    from blender_addon.logic.frames import Frame
    view = LiveView.__new__(LiveView)  # its frame logic only, on a stand-in stream
    view.shows, view.texture_seq = ("scene", None, 0.5), 0
    for dynamic in (True, False):
        then = Frame(1, (None, 1.0, 0, ("scene", None, 0.25)), {"dynamic": dynamic}, None)  # asked at t = 0.25
        now = Frame(2, (None, 1.0, 0, ("scene", None, 0.5)), {"dynamic": dynamic}, None)
        assert view.of_this_time(now)
        assert view.of_this_time(then) == (not dynamic)
        view.stream = SimpleNamespace(frame=then)
        assert view.frame_to_show() == (not dynamic)  # a 4D frame of another time asks for no redraw


def test_training_that_finishes_is_reported_once_and_a_session_found_finished_is_not():
    from blender_addon.logic.runtime import Backend, Outcome
    backend = Backend()
    state = {"event": "state", "session": "cube", "state": "finished", "step": 300, "iterations": 300,
             "gaussians": 4144}
    for event in (state, {**state, "state": "training", "step": 0}, state, state):  # connected to a finished one
        backend._outcomes.put(Outcome("event", "events", event))
    assert backend.drain()[1] == [("INFO", "training of cube finished: step 300 of 300, 4,144 Gaussians")]


def test_a_connection_to_a_failed_training_keeps_its_reason_as_the_backends_error():
    from blender_addon.logic.runtime import Backend
    backend = Backend()
    backend.errors["connection"] = "refused"
    status = {"session": "cube", "state": "failed", "step": 30, "reason": "at step 31: training diverged"}
    said = backend._connected({"capabilities": {"device": "cpu"}, "status": status, "reopened": ""})
    assert backend.errors == {"backend": "the training of cube failed at step 31: training diverged"}
    assert said.endswith("; the training of cube failed at step 31: training diverged")  # Blender's reports say it
    backend._connected({"capabilities": {"device": "cpu"}, "status": {**status, "state": "stopped", "reason": None},
                        "reopened": ""})
    assert backend.errors == {}


def test_the_machines_device_is_a_gpu_where_nvidias_driver_is_loaded(monkeypatch, tmp_path):
    from blender_addon.logic import defaults
    found = {}
    for system, driver_loaded in (("Linux", True), ("Linux", False), ("Darwin", True)):
        monkeypatch.setattr(defaults.platform, "system", lambda: system)
        monkeypatch.setattr(defaults, "NVIDIA_DRIVER", tmp_path / ("version" if driver_loaded else "none"))
        (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module")
        defaults.machine_device.cache_clear()
        found[system, driver_loaded] = defaults.machine_device()
    defaults.machine_device.cache_clear()
    assert found == {("Linux", True): defaults.GPU, ("Linux", False): defaults.CPU, ("Darwin", True): defaults.CPU}


# ---- undistorting a COLMAP import ----

def test_an_undistortion_without_pycolmap_or_a_backend_says_what_to_do(tmp_path):
    with pytest.raises(SplatwrightError, match="needs pycolmap, which Blender's Python lacks, or the backend's Python: "
                                               "press Set Up Backend"):
        undistortion.Undistortion(tmp_path, None, str(tmp_path / "no-python"), ROOT)


def test_the_backends_undistortion_error_is_told_in_its_words(tmp_path):
    """The backend's Python run on a folder without a COLMAP model: its `error:` line is the result's message."""
    import sys
    job = undistortion.Undistortion(tmp_path, None, sys.executable, ROOT)
    assert job.how == undistortion.BY_BACKEND
    with pytest.raises(SplatwrightError) as e:
        job.wait()
    assert job.finished and str(e.value).startswith(f"{tmp_path}:") and "error:" not in str(e.value)
