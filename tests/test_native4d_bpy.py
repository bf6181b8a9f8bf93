"""A 4D model as Blender's own splats in real Blender 5.3 or later (the bpy module): at the first, a middle (with
a subframe) and the last frame of the scene's range the object Blender evaluates holds DynamicGaussians.at(t) in
Blender's conventions (logic/native.py), t the frame's time as dataset.frame_time maps it; and Cycles renders it
at the first and last frames as close to our render of the model at times 0 and 1 (Blender's image formation) as
it renders a static object of the model at time 0 to ours. tests/blender/scenarios/native4d.py runs in Blender."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from blender_addon.core.cameras import Camera, intrinsics, look_at
from blender_addon.core.splats import read_motion_ply_bytes, read_ply_bytes
from blender_addon.logic.dataset import frame_time
from blender_addon.logic.native import BASE, POSITION, ROTATION, SCALE, native_attributes, to_attributes
from backend.formats.ply import encode_ply
from backend.service.exports import motion_ply_bytes
from backend.render.formation import linear_to_srgb, srgb_to_linear
from backend.tools.bench.formation import blender_camera, display, our_render, psnr
from blender.runner import BLENDERS, NATIVE_SPLATS, SCENARIOS, run_scenario
from helpers import moving_model

pytestmark = pytest.mark.blender

FRAMES, MIDDLE, SIZE, SAMPLES = (1, 25), (9, 0.4), 48, 64


def saved(path, values: dict) -> str:
    np.savez(path, **{name.replace(":", "__"): v for name, v in values.items()})
    return str(path)


def loaded(path: str) -> dict:
    with np.load(path) as data:
        return {name.replace("__", ":"): data[name] for name in data.files}


@pytest.fixture(scope="module", params=NATIVE_SPLATS or [None])
def shown(addon_zip, tmp_path_factory, request) -> dict:
    if request.param is None:
        pytest.skip(f"no tested Blender draws splats natively (5.3 or later; tested: {', '.join(BLENDERS)})")
    home = tmp_path_factory.mktemp(f"blender-native4d-{request.param}")
    model = moving_model(150, seed=3)
    model.time_centers = torch.rand(len(model), generator=torch.Generator().manual_seed(9))
    model.angular_velocities[:4] = 0.0
    model.means = 0.5 * model.means - 0.3 * model.velocities  # in view over the whole clip
    camera = Camera(look_at(np.array([2.2, -2.6, 1.8]), np.zeros(3)), intrinsics(52.0, 52.0, SIZE / 2, SIZE / 2),
                    SIZE, SIZE)
    static, motion = read_motion_ply_bytes(motion_ply_bytes(model, "blender"))
    job = {"model": saved(home / "model.npz", native_attributes(static, motion)),
           "static": saved(home / "static.npz", to_attributes(read_ply_bytes(encode_ply(model.at(0.0))))),
           "frames": FRAMES, "middle": MIDDLE, "camera": blender_camera(camera), "samples": SAMPLES}
    (home / "job.json").write_text(json.dumps(job))
    result = run_scenario(SCENARIOS / "native4d.py", home, "--zip", str(addon_zip), "--job", str(home / "job.json"),
                          "--out", str(home / "out"), timeout=300, blender=request.param)
    assert "failure" not in result, result
    return {**result, "model": model, "camera": camera}


def test_the_object_blender_evaluates_is_the_model_at_the_frames_time(shown):
    model = shown["model"]
    assert shown["modifiers"] == ["Splatwright Motion"] and shown["evaluated_type"] == "GAUSSIAN_SPLAT"
    frames = {"start": FRAMES[0], "middle": MIDDLE[0] + MIDDLE[1], "end": FRAMES[1]}
    for what, frame in frames.items():
        time = frame_time(frame, *FRAMES)
        ours = loaded(shown["shown"][what])
        expected = to_attributes(read_ply_bytes(encode_ply(model.at(time))))
        assert set(ours) == set(expected), what
        np.testing.assert_allclose(ours[POSITION], expected[POSITION], rtol=0, atol=1e-5, err_msg=what)
        np.testing.assert_allclose(ours[ROTATION], expected[ROTATION], rtol=0, atol=1e-6, err_msg=what)
        np.testing.assert_allclose(ours[BASE], expected[BASE], rtol=1e-6, atol=1e-7, err_msg=what)
        np.testing.assert_array_equal(ours[SCALE], expected[SCALE])
        print(f"{what} (t={time:.3f}): positions within {np.abs(ours[POSITION] - expected[POSITION]).max():.1e}, "
              f"rotations {np.abs(ours[ROTATION] - expected[ROTATION]).max():.1e}, opacities "
              f"{np.abs(ours[BASE][:, 3] - expected[BASE][:, 3]).max():.1e}")


def test_cycles_renders_it_as_close_to_ours_as_a_static_object(shown):
    model, camera = shown["model"], shown["camera"]
    score = {}
    for what, time in (("start", 0.0), ("end", 1.0)):
        ours = our_render(model.at(time).detached(), camera, (0.0, 0.0, 0.0), "blender")
        score[what] = psnr(display(np.load(shown["renders"][what])), ours)
    ours = our_render(model.at(0.0).detached(), camera, (0.0, 0.0, 0.0), "blender")
    static = psnr(display(np.load(shown["renders"]["static"])), ours)
    print(f"Cycles ({SAMPLES} samples, {SIZE} px) against ours (Blender's formation): the 4D object at its first "
          f"frame {score['start']:.2f} dB, at its last {score['end']:.2f} dB; a static object of the model at time 0 "
          f"{static:.2f} dB")
    alike = psnr(display(np.load(shown["renders"]["start"])), display(np.load(shown["renders"]["static"])))
    print(f"the 4D object at its first frame against the static object: {alike:.2f} dB (the same splats)")
    assert score["start"] > static - 0.5 and score["end"] > static - 1.5 and static > 25


def test_cycles_blurs_its_motion(shown):
    """The middle of three frames, its shutter a whole frame: t from 0.25 to 0.75. Cycles' blurred render is
    nearer our renders averaged over the shutter (in linear light, as the film accumulates) than our render at
    t = 0.5, and the sharp render the other way round. The frame handler sets the opacities once per frame, so the
    average is over positions and rotations only (opacities at t = 0.5)."""
    model, camera = shown["model"], shown["camera"]
    middle = model.at(0.5).detached()
    sharp_ours = our_render(middle, camera, (0.0, 0.0, 0.0), "blender")
    linear = []
    for t in np.linspace(0.25, 0.75, 9):
        moved = model.at(float(t)).detached()
        moved.opacity_logits = middle.opacity_logits
        linear.append(srgb_to_linear(torch.from_numpy(our_render(moved, camera, (0.0, 0.0, 0.0), "blender"))))
    blurred_ours = linear_to_srgb(torch.stack(linear).mean(0)).numpy()
    sharp, blurred = (display(np.load(shown["renders"][name])) for name in ("sharp", "blurred"))
    scores = {"sharp": (psnr(sharp, sharp_ours), psnr(sharp, blurred_ours)),
              "blurred": (psnr(blurred, sharp_ours), psnr(blurred, blurred_ours))}
    print("Cycles against ours at t = 0.5 / ours averaged over the shutter: "
          + ", ".join(f"{name} {a:.2f} / {b:.2f} dB" for name, (a, b) in scores.items()))
    assert scores["blurred"][1] > scores["blurred"][0] + 1.0
    assert scores["sharp"][0] > scores["sharp"][1] + 1.0
