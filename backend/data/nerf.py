"""NeRF-synthetic / instant-ngp scenes: `transforms*.json` files (cameras, and the images they name, with the
D-NeRF `time` of each frame where a scene moves)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from PIL import Image

from blender_addon.core.cameras import Camera, from_blender_c2w, intrinsics, intrinsics_from_fov_x
from blender_addon.core.codecs import MAX_IMAGE_SIDE
from blender_addon.core.errors import SplatwrightError
from .dataset import Dataset, scene_times
from .images import BACKGROUND, check_downscale, load_rgb, quantise, resized


def transforms_path(root: str | Path, split: str) -> Path | None:
    """The transforms file of `split`: transforms_<split>.json, or transforms.json for training."""
    root = Path(root)
    if not root.is_dir():
        raise SplatwrightError(f"{root}: {'not a folder' if root.exists() else 'not found'}; give the scene folder "
                               "(the one holding transforms_train.json or transforms.json, or a COLMAP capture's, holding "
                               "sparse/0/ and images/)")
    path = root / f"transforms_{split}.json"
    if path.is_file():
        return path
    if split == "train" and (root / "transforms.json").is_file():
        return root / "transforms.json"
    return None


def load_transforms(path: Path, background=BACKGROUND, downscale: float = 1.0) -> Dataset:
    meta = _read_meta(path)
    frames = meta["frames"]
    check_downscale(downscale)

    cameras, images, names, times = [], [], [], []
    bg = np.asarray(background, dtype=np.float32)
    for i, frame in enumerate(frames):
        what = f"{path.name} frame {i}"
        _check_frame(frame, what)
        times.append(_frame_time(frame, what))
        image_path = _find_image(path.parent, frame.get("file_path"), what)
        rgb = load_rgb(image_path, bg)
        h, w = rgb.shape[:2]
        cam = _frame_camera(meta, frame, w, h, what)
        if downscale != 1.0:
            cam = cam.scaled(1.0 / downscale)
            rgb = resized(rgb, cam.width, cam.height)
        cameras.append(cam)
        images.append(quantise(rgb))
        names.append(Path(str(frame.get("file_path"))).name)
    return Dataset(cameras, images, names, scene_times(times, path.name))


def load_cameras(path: Path, downscale: float = 1.0) -> tuple[list[Camera], list[str]]:
    """Only the cameras of a transforms file; image sizes come from its w/h or from the image headers."""
    check_downscale(downscale)
    meta = _read_meta(path)
    cameras, names = [], []
    for i, frame in enumerate(meta["frames"]):
        what = f"{path.name} frame {i}"
        _check_frame(frame, what)
        w, h = frame.get("w", meta.get("w")), frame.get("h", meta.get("h"))
        if w is None or h is None:
            image_path = _find_image(path.parent, frame.get("file_path"), what)
            try:
                with Image.open(image_path) as im:
                    w, h = im.size
            except (OSError, Image.DecompressionBombError) as e:
                raise SplatwrightError(f"{image_path}: cannot read image ({e})") from None
        w, h = (_pixels(value, key, what) for key, value in (("w", w), ("h", h)))
        cam = _frame_camera(meta, frame, w, h, what)
        cameras.append(cam.scaled(1.0 / downscale) if downscale != 1.0 else cam)
        names.append(Path(str(frame.get("file_path", f"view_{i:03d}"))).name)
    return cameras, names


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        raise SplatwrightError(f"{path}: transforms file not found")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SplatwrightError(f"{path}: cannot read transforms ({e})") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise SplatwrightError(f"{path}: no 'frames' list")
    return meta


def _pixels(value, key: str, what: str) -> int:
    """An image side from a transforms file: a whole number in [1, MAX_IMAGE_SIDE]."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer()
            or not 1 <= value <= MAX_IMAGE_SIDE):
        raise SplatwrightError(f"{what}: {key} must be a whole number of pixels in [1, {MAX_IMAGE_SIDE}], "
                               f"got {value!r}")
    return int(value)


def _check_frame(frame, what: str) -> None:
    if not isinstance(frame, dict):
        raise SplatwrightError(f"{what}: a frame must be a JSON object, got {type(frame).__name__}")


def _frame_time(frame: dict, what: str) -> float | None:
    """The frame's D-NeRF `time` in [0, 1], or None where it has none."""
    value = frame.get("time")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise SplatwrightError(f"{what}: time must be a number in [0, 1] (the D-NeRF convention), got {value!r}")
    return float(value)


def _frame_camera(meta: dict, frame: dict, w: int, h: int, what: str) -> Camera:
    K = _intrinsics(meta, frame, w, h, what)
    try:
        matrix = np.array(frame.get("transform_matrix"), dtype=np.float64)
    except (ValueError, TypeError):
        raise SplatwrightError(f"{what}: transform_matrix must be a 4x4 list of numbers") from None
    return from_blender_c2w(matrix, K, w, h, what)


def _find_image(folder: Path, file_path, what: str) -> Path:
    if not isinstance(file_path, str) or not file_path:
        raise SplatwrightError(f"{what}: missing 'file_path'")
    base = folder / file_path
    for candidate in (base, base.with_name(base.name + ".png")):
        if candidate.is_file():
            return candidate
    raise SplatwrightError(f"{what}: image not found: {base} (also tried {base.name}.png)")


def _intrinsics(meta: dict, frame: dict, w: int, h: int, what: str) -> np.ndarray:
    if not isinstance(frame, dict):
        raise SplatwrightError(f"{what}: a frame must be a JSON object")

    def get(key, default=None, positive: bool = False):
        """The frame's (else the file's) number `key`, checked finite (and positive)."""
        value = frame.get(key, meta.get(key))
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SplatwrightError(f"{what}: {key} must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise SplatwrightError(f"{what}: {key} must be positive, got {value}")
        return float(value)
    if get("fl_x") is not None:
        fl_x = get("fl_x", positive=True)
        fl_y = get("fl_y", fl_x, positive=True)
        ref_w, ref_h = get("w", w, positive=True), get("h", h, positive=True)
        cx, cy = get("cx", ref_w / 2), get("cy", ref_h / 2)
        sx, sy = w / ref_w, h / ref_h  # the file's intrinsics refer to its w, h
        return intrinsics(fl_x * sx, fl_y * sy, cx * sx, cy * sy)
    if get("camera_angle_x") is not None:
        return intrinsics_from_fov_x(get("camera_angle_x"), w, h)
    raise SplatwrightError(f"{what}: no intrinsics (need camera_angle_x or fl_x/fl_y/cx/cy)")
