"""Datasets: NeRF-synthetic / instant-ngp `transforms*.json` scenes loaded into memory as tensors."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.cameras import Camera, from_blender_c2w, intrinsics, intrinsics_from_fov_x
from blender_addon.core.codecs import MAX_IMAGE_SIDE
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.points import POINTS_FILE, read_points


def quantise(image) -> torch.Tensor:
    """The stored form of a float image in [0, 1] (a tensor or array, any shape): uint8 round(255 x), on the
    image's device. Converts one view at a time: the float temporaries are that view's size."""
    image = torch.from_numpy(np.ascontiguousarray(image)) if isinstance(image, np.ndarray) else image
    if image.dtype == torch.uint8:
        return image
    return image.clamp(0.0, 1.0).mul_(255.0).round_().to(torch.uint8)


def as_float(image: torch.Tensor) -> torch.Tensor:
    """A stored (uint8) image as float32 in [0, 1] (v / 255), on its device; a float image as it is."""
    return image.float() / 255.0 if image.dtype == torch.uint8 else image


@dataclass
class Dataset:
    """A scene's views: cameras, images, names and, for a scene over time, the views' times.

    `images` stores the views compactly as uint8 (N, H, W, 3): round(255 x) of each float image x in [0, 1]
    composited over the background (quantise), a quarter of float32's memory (300 views at 1920x1080 take
    1.9 GB, not 7.5), kept whole on the training device. Read a view as float with image(i) (float32
    (H, W, 3) in [0, 1], on the images' device); convert view by view, never all of them at once. The CUDA
    loss reads uint8 targets as they are (cuda/training.cu)."""
    cameras: list[Camera]
    images: torch.Tensor  # (N, H, W, 3) uint8, see above
    names: list[str]
    times: list[float] | None = None  # per view, in [0, 1] over the captured frames; None: a static scene

    def __post_init__(self):
        if self.images.dtype != torch.uint8:
            raise TypeError(f"Dataset.images must be uint8 (each view through data.quantise), not {self.images.dtype}")

    def __len__(self) -> int:
        return len(self.cameras)

    def image(self, i: int) -> torch.Tensor:
        """View i as float32 (H, W, 3) in [0, 1], on the images' device."""
        return as_float(self.images[i])

    def time(self, i: int) -> float:
        """The time of view i (0 in a static scene)."""
        return self.times[i] if self.times is not None else 0.0

    def to(self, device) -> "Dataset":
        return Dataset(self.cameras, self.images.to(device), self.names, self.times)

    def mean_color(self) -> tuple[float, float, float]:
        """The views' mean colour, each channel over every pixel of every view, in [0, 1]."""
        total = sum(view.float().mean(dim=(0, 1)) for view in self.images)  # one view at a time in float
        return tuple(float(c) for c in total / (255.0 * len(self)))


# NeRF-synthetic lego where the project's shared data sits beside the checkout: the demo's fallback scene and
# the benchmarks' and tests' scene.
LEGO = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "lego"


def parse_background(text: str) -> tuple[float, float, float]:
    """'white', 'black' or 'r,g,b' with components in [0, 1]."""
    named = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
    if text in named:
        return named[text]
    try:
        rgb = tuple(float(c) for c in text.split(","))
    except ValueError:
        rgb = ()
    if len(rgb) != 3 or not all(0.0 <= c <= 1.0 for c in rgb):
        raise SplatwrightError(f"background {text!r}: use 'white', 'black' or three numbers in [0, 1] like 0.5,0.5,0.5")
    return rgb


def transforms_path(root: str | Path, split: str) -> Path | None:
    """The transforms file of `split`: transforms_<split>.json, or transforms.json for training."""
    root = Path(root)
    if not root.is_dir():
        raise SplatwrightError(f"{root}: {'not a folder' if root.exists() else 'not found'}; give the scene folder "
                               "(the one holding transforms_train.json or transforms.json)")
    path = root / f"transforms_{split}.json"
    if path.is_file():
        return path
    if split == "train" and (root / "transforms.json").is_file():
        return root / "transforms.json"
    return None


def scene_point_cloud(root: str | Path) -> tuple[Path, np.ndarray, np.ndarray] | None:
    """The scene's own points, if it has any: its points3d.ply (a capture's surface points), else its COLMAP
    model's; (where they come from, positions (N, 3), uint8 colours (N, 3)), or None."""
    from . import colmap  # it builds on this module
    path, model = Path(root) / POINTS_FILE, colmap.find_model(root)
    if path.is_file():
        xyz, rgb = read_points(path)
    elif model is not None:
        path, (xyz, rgb) = model, colmap.read_points(root)
    else:
        return None
    return (path, xyz, rgb) if len(xyz) else None


def load_split(root: str | Path, split: str, background=(1.0, 1.0, 1.0), downscale: float = 1.0) -> Dataset | None:
    """Load one split, or None if the scene has no file for it (only 'train' is required). A folder without
    transforms files but with a COLMAP model (sparse/0) is a COLMAP capture (backend.colmap)."""
    from . import colmap  # it builds on this module
    if transforms_path(root, "train") is None and colmap.find_model(root) is not None:
        return colmap.load_split(root, split, background, downscale)
    path = transforms_path(root, split)
    if path is None:
        if split == "train":
            raise SplatwrightError(f"{root}: no transforms_train.json or transforms.json; expected a NeRF-synthetic "
                                   "or instant-ngp scene folder, or a COLMAP one (images/ and sparse/0/)")
        return None
    return load_transforms(path, background, downscale)


def load_transforms(path: Path, background=(1.0, 1.0, 1.0), downscale: float = 1.0) -> Dataset:
    meta = _read_meta(path)
    frames = meta["frames"]
    _check_downscale(downscale)

    cameras, images, names, times = [], [], [], []
    size = None
    bg = np.asarray(background, dtype=np.float32)
    for i, frame in enumerate(frames):
        what = f"{path.name} frame {i}"
        _check_frame(frame, what)
        times.append(_frame_time(frame, what))
        image_path = _find_image(path.parent, frame.get("file_path"), what)
        rgb = load_rgb(image_path, bg)
        h, w = rgb.shape[:2]
        if size is None:
            size = (w, h)
        elif (w, h) != size:
            raise SplatwrightError(f"{image_path}: image is {w}x{h} but earlier images are {size[0]}x{size[1]}; "
                                   "all views of a scene must have one size")
        cam = _frame_camera(meta, frame, w, h, what)
        if downscale != 1.0:
            cam = cam.scaled(1.0 / downscale)
            rgb = np.asarray(Image.fromarray((rgb * 255 + 0.5).astype(np.uint8)).resize(
                (cam.width, cam.height), Image.Resampling.BOX), dtype=np.float32) / 255.0
        cameras.append(cam)
        images.append(quantise(rgb))
        names.append(Path(str(frame.get("file_path"))).name)
    return Dataset(cameras, torch.stack(images), names, scene_times(times, path.name))


def load_cameras(path: str | Path, downscale: float = 1.0) -> tuple[list[Camera], list[str]]:
    """Only the cameras of a transforms file (or of a COLMAP capture folder); image sizes come from its w/h or
    from the image headers."""
    from . import colmap
    path = Path(path)
    if path.is_dir() and colmap.find_model(path) is not None:
        return colmap.load_cameras(path, downscale)
    _check_downscale(downscale)
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


def _check_downscale(downscale: float) -> None:
    if not downscale >= 1.0:
        raise SplatwrightError(f"downscale must be a number >= 1, got {downscale}")


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


def scene_times(times: list[float | None], what: str) -> list[float] | None:
    """The views' times: None when no view has one; every view needs one when some do."""
    missing = [i for i, t in enumerate(times) if t is None]
    if len(missing) == len(times):
        return None
    if missing:
        raise SplatwrightError(f"{what}: view {missing[0]} has no time but other views do; give every view a time "
                               "in [0, 1], or none")
    return times


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


def over_background(image: np.ndarray, background) -> np.ndarray:
    """(H, W, 3) float32 RGB of a float (H, W, 3 or 4) image in [0, 1]; an alpha channel is composited over
    `background`, as training sees every view."""
    if image.shape[-1] == 4:
        return image[..., :3] * image[..., 3:] + np.asarray(background, dtype=np.float32) * (1.0 - image[..., 3:])
    return image


def load_rgb(path: Path, background) -> np.ndarray:
    """8-bit image as float RGB in [0, 1], over `background`."""
    try:
        with Image.open(path) as im:
            im = im.convert("RGBA") if im.mode in ("RGBA", "LA", "P") else im.convert("RGB")
            a = np.asarray(im, dtype=np.float32) / 255.0
    except (OSError, Image.DecompressionBombError) as e:
        raise SplatwrightError(f"{path}: cannot read image ({e})") from None
    return over_background(a, background)


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


def scene_bounds(cameras: list[Camera]) -> tuple[np.ndarray, float]:
    """Centre and half-size of the region to fill with initial Gaussians. Cameras around an object look at a
    common region: the point nearest to all optical axes, and half the width the nearest camera sees there.
    Cameras among the scene (a room seen from inside, looking outward) have no such region: a cube around
    the cameras, 1.5x their extent, so the walls they see are inside it."""
    centres = np.stack([c.position for c in cameras])
    axes = np.stack([c.c2w[:3, 2] for c in cameras])
    A = np.zeros((3, 3))
    b = np.zeros(3)
    for o, d in zip(centres, axes):
        P = np.eye(3) - np.outer(d, d)  # projects onto the plane normal to the axis
        A += P
        b += P @ o
    if np.linalg.cond(A) < 1e8:
        center = np.linalg.solve(A, b)
    else:  # parallel axes: fall back to a point in front of the mean camera
        center = centres.mean(0) + axes.mean(0)
    dist = np.linalg.norm(centres - center, axis=1)
    facing = ((center - centres) * axes).sum(1) > 0.5 * dist  # the centre within 60 degrees of the axis
    if facing.mean() < 0.5:
        return centres.mean(0), 1.5 * camera_extent(cameras)
    nearest = int(np.argmin(dist))
    cam = cameras[nearest]
    half_width = 0.5 * dist[nearest] * cam.width / cam.K[0, 0]
    return center, float(max(half_width, 1e-3))


def camera_extent(cameras: list[Camera]) -> float:
    """The 3DGS scene extent: 1.1 x the radius of the camera centres around their mean."""
    centres = np.stack([c.position for c in cameras])
    return float(1.1 * max(np.linalg.norm(centres - centres.mean(0), axis=1).max(), 1e-3))
