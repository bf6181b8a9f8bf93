"""COLMAP reconstructions as datasets: a folder with `images/` and a model (`cameras`, `images`, `points3D`, as
.bin or .txt) in `sparse/0/` (what `colmap mapper` writes) or `sparse/` (what `colmap image_undistorter` writes).

COLMAP's conventions are ours: images store world-to-camera rotations (as quaternions w, x, y, z) and
translations of OpenCV-style cameras (x right, y down, z forward), and pixel coordinates put the centre of the
top-left pixel at (0.5, 0.5). So poses and intrinsics carry over as they are; the world frame is COLMAP's.
PINHOLE and SIMPLE_PINHOLE cameras are read; models with lens distortion are refused, with the command that
undistorts them. Images are taken in name order and every 8th (the first, the ninth, ...) is held out for
testing, as 3DGS does with such captures.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from blender_addon.core.cameras import Camera, check_rigid, intrinsics, rigid_inverse
from blender_addon.core.errors import SplatwrightError
from .data import Dataset, _check_downscale, load_rgb

TEST_EVERY = 8
# COLMAP's camera models: id -> (name, number of parameters).
MODELS = {0: ("SIMPLE_PINHOLE", 3), 1: ("PINHOLE", 4), 2: ("SIMPLE_RADIAL", 4), 3: ("RADIAL", 5), 4: ("OPENCV", 8),
          5: ("OPENCV_FISHEYE", 8), 6: ("FULL_OPENCV", 12), 7: ("FOV", 5), 8: ("SIMPLE_RADIAL_FISHEYE", 4),
          9: ("RADIAL_FISHEYE", 5), 10: ("THIN_PRISM_FISHEYE", 12), 11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16)}
PARAMETER_COUNTS = {name: count for name, count in MODELS.values()}


@dataclass(frozen=True)
class ColmapCamera:
    model: str
    width: int
    height: int
    params: tuple[float, ...]


@dataclass(frozen=True)
class ColmapImage:
    name: str
    camera_id: int
    qvec: np.ndarray  # (4,) world-to-camera rotation, w x y z
    tvec: np.ndarray  # (3,) world-to-camera translation
    xys: np.ndarray  # (M, 2) observed pixel positions
    point_ids: np.ndarray  # (M,) the 3D point each observes, -1 for none


@dataclass(frozen=True)
class Model:
    cameras: dict[int, ColmapCamera]
    images: dict[int, ColmapImage]
    xyz: np.ndarray  # (P, 3) float32
    rgb: np.ndarray  # (P, 3) uint8
    point_ids: np.ndarray  # (P,) int64


def find_model(root: str | Path) -> Path | None:
    """The model folder of a COLMAP capture folder, or None when `root` is not one."""
    root = Path(root)
    for folder in (root / "sparse" / "0", root / "sparse"):
        if (folder / "cameras.bin").is_file() or (folder / "cameras.txt").is_file():
            return folder
    return None


def read_model(folder: str | Path) -> Model:
    """Cameras, images and points of a model folder, from its .bin files or else its .txt files."""
    folder = Path(folder)
    binary = (folder / "cameras.bin").is_file()
    ext = ".bin" if binary else ".txt"
    for part in ("cameras", "images", "points3D"):
        if not (folder / f"{part}{ext}").is_file():
            raise SplatwrightError(f"{folder}: COLMAP model without {part}{ext}")
    try:
        if binary:
            return Model(_cameras_bin(folder / "cameras.bin"), _images_bin(folder / "images.bin"),
                         *_points_bin(folder / "points3D.bin"))
        return Model(_cameras_txt(folder / "cameras.txt"), _images_txt(folder / "images.txt"),
                     *_points_txt(folder / "points3D.txt"))
    except (struct.error, ValueError, IndexError, UnicodeDecodeError) as e:
        raise SplatwrightError(f"{folder}: unreadable COLMAP {ext} model ({e}); a file may be truncated") from None


def camera_of(model: Model, image: ColmapImage, what: str) -> Camera:
    """Our camera for one of the model's images, at the size its camera declares."""
    cam = model.cameras.get(image.camera_id)
    if cam is None:
        raise SplatwrightError(f"{what}: camera {image.camera_id} is not in cameras")
    if cam.model == "SIMPLE_PINHOLE":
        f, cx, cy = cam.params
        K = intrinsics(f, f, cx, cy)
    elif cam.model == "PINHOLE":
        K = intrinsics(*cam.params)
    else:
        raise SplatwrightError(
            f"{what}: COLMAP camera model {cam.model} has lens distortion, which Gaussian splatting cannot render; "
            "undistort the capture first: colmap image_undistorter --image_path images --input_path sparse/0 "
            "--output_path undistorted, then train on the undistorted folder")
    w2c = np.eye(4)
    w2c[:3, :3] = quat_to_matrix(image.qvec)
    w2c[:3, 3] = image.tvec
    return Camera(check_rigid(rigid_inverse(w2c), what), K, cam.width, cam.height)


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    w, x, y, z = np.asarray(q, np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def split_images(model: Model, split: str) -> list[ColmapImage]:
    """The images of `split` ("train", "test", or "all"), in name order; every 8th is a test image."""
    ordered = sorted(model.images.values(), key=lambda im: im.name)
    if split == "all":
        return ordered
    return [im for i, im in enumerate(ordered) if (i % TEST_EVERY == 0) == (split == "test")]


def load_split(root: str | Path, split: str, background=(1.0, 1.0, 1.0), downscale: float = 1.0) -> Dataset | None:
    """The images of `split` with their cameras (None for an empty test split)."""
    root = Path(root)
    model = read_model(find_model(root))
    chosen = split_images(model, split)
    if not chosen:
        if split == "train":
            raise SplatwrightError(f"{root}: the COLMAP model registers too few images to train on")
        return None
    cameras, images, size = [], [], None
    bg = np.asarray(background, dtype=np.float32)
    for image in chosen:
        path = root / "images" / image.name
        if not path.is_file():
            raise SplatwrightError(f"{root}: image {image.name} of the COLMAP model is not in {root / 'images'}")
        rgb = load_rgb(path, bg)
        cam = _fitted(camera_of(model, image, f"{root} image {image.name}"), rgb.shape[1], rgb.shape[0], downscale)
        if size is None:
            size = (cam.width, cam.height)
        elif (cam.width, cam.height) != size:
            raise SplatwrightError(f"{path}: {cam.width}x{cam.height}, but earlier images are {size[0]}x{size[1]}; "
                                   "all views of a scene must have one size")
        if (cam.width, cam.height) != (rgb.shape[1], rgb.shape[0]):
            rgb = np.asarray(Image.fromarray((rgb * 255 + 0.5).astype(np.uint8)).resize(
                (cam.width, cam.height), Image.Resampling.BOX), dtype=np.float32) / 255.0
        cameras.append(cam)
        images.append(torch.from_numpy(np.ascontiguousarray(rgb)))
    return Dataset(cameras, torch.stack(images), [Path(im.name).stem for im in chosen])


def load_cameras(root: str | Path, downscale: float = 1.0) -> tuple[list[Camera], list[str]]:
    """Every registered image's camera, at the size its camera declares (divided by `downscale`), and the image
    names without extension (as a transforms file names its frames)."""
    model = read_model(find_model(root))
    chosen = split_images(model, "all")
    cameras = [camera_of(model, im, f"{root} image {im.name}") for im in chosen]
    return [_fitted(c, c.width, c.height, downscale) for c in cameras], [Path(im.name).stem for im in chosen]


def read_points(root: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """The model's 3D points: (xyz (P, 3) float32, rgb (P, 3) uint8)."""
    model = read_model(find_model(root))
    return model.xyz, model.rgb


def _fitted(cam: Camera, width: int, height: int, downscale: float) -> Camera:
    """`cam` for an image file of `width` x `height` (its intrinsics scaled from the declared size), then divided
    by `downscale`."""
    _check_downscale(downscale)
    K = cam.K.copy()
    K[0] *= width / cam.width
    K[1] *= height / cam.height
    fitted = Camera(cam.c2w, K, width, height)
    return fitted.scaled(1.0 / downscale) if downscale != 1.0 else fitted


# --- the files ------------------------------------------------------------------------------------------------

class _Reader:
    """Little-endian values from the start of a binary file on."""

    def __init__(self, path: Path):
        self.data, self.offset = path.read_bytes(), 0

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype, count: int) -> np.ndarray:
        a = np.frombuffer(self.data, dtype, count, self.offset)
        self.offset += a.nbytes
        return a

    def name(self) -> str:
        end = self.data.index(b"\0", self.offset)
        text = self.data[self.offset:end].decode("utf-8")
        self.offset = end + 1
        return text

    def end(self, path: Path) -> None:
        if self.offset != len(self.data):
            raise SplatwrightError(f"{path}: {len(self.data) - self.offset} bytes after the last record; "
                                   "the record count does not match the data")


def _camera(path: Path, camera_id: int, model: str, width: int, height: int, params) -> ColmapCamera:
    if model not in PARAMETER_COUNTS:
        raise SplatwrightError(f"{path}: camera {camera_id} has the unknown model {model}")
    if len(params) != PARAMETER_COUNTS[model]:
        raise SplatwrightError(f"{path}: camera {camera_id} ({model}) has {len(params)} parameters, "
                               f"expected {PARAMETER_COUNTS[model]}")
    if width < 1 or height < 1 or not np.all(np.isfinite(params)):
        raise SplatwrightError(f"{path}: camera {camera_id} has a bad size or NaN parameters")
    return ColmapCamera(model, int(width), int(height), tuple(float(p) for p in params))


def _image(path: Path, image_id: int, q, t, camera_id: int, name: str, xys, point_ids) -> ColmapImage:
    q, t = np.asarray(q, np.float64), np.asarray(t, np.float64)
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(t))) or np.linalg.norm(q) < 1e-12:
        raise SplatwrightError(f"{path}: image {image_id} ({name}) has a NaN or zero pose")
    return ColmapImage(name, int(camera_id), q, t, np.asarray(xys, np.float64).reshape(-1, 2),
                       np.asarray(point_ids, np.int64))


def _points(path: Path, ids: list, xyz: list, rgb: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xyz = np.asarray(xyz, np.float64).reshape(-1, 3)
    if not np.all(np.isfinite(xyz)):
        raise SplatwrightError(f"{path}: some points have NaN or infinite positions")
    return xyz.astype(np.float32), np.asarray(rgb, np.uint8).reshape(-1, 3), np.asarray(ids, np.int64)


def _cameras_bin(path: Path) -> dict[int, ColmapCamera]:
    r, cameras = _Reader(path), {}
    for _ in range(r.read("Q")[0]):
        camera_id, model_id, width, height = r.read("iiQQ")
        if model_id not in MODELS:
            raise SplatwrightError(f"{path}: camera {camera_id} has the unknown model id {model_id}")
        name, count = MODELS[model_id]
        cameras[camera_id] = _camera(path, camera_id, name, width, height, r.read(f"{count}d"))
    r.end(path)
    return cameras


def _images_bin(path: Path) -> dict[int, ColmapImage]:
    r, images = _Reader(path), {}
    for _ in range(r.read("Q")[0]):
        image_id, *pose, camera_id = r.read("i7di")
        name = r.name()
        observations = r.array(np.dtype([("xy", "<f8", 2), ("id", "<i8")]), r.read("Q")[0])
        images[image_id] = _image(path, image_id, pose[:4], pose[4:], camera_id, name, observations["xy"],
                                  observations["id"])
    r.end(path)
    return images


def _points_bin(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, ids, xyz, rgb = _Reader(path), [], [], []
    for _ in range(r.read("Q")[0]):
        point_id, x, y, z, red, green, blue, _error, track = r.read("Q3d3BdQ")
        r.array(np.dtype("<i4"), 2 * track)  # the track: (image id, point index) pairs
        ids.append(point_id)
        xyz.append((x, y, z))
        rgb.append((red, green, blue))
    r.end(path)
    return _points(path, ids, xyz, rgb)


def _text_rows(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def _cameras_txt(path: Path) -> dict[int, ColmapCamera]:
    return {int(w[0]): _camera(path, int(w[0]), w[1], int(w[2]), int(w[3]), [float(v) for v in w[4:]])
            for w in _text_rows(path)}


def _images_txt(path: Path) -> dict[int, ColmapImage]:
    images = {}
    # Two lines per image; the second (its 2D points) may be empty, so blank lines count here.
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) % 2 == 1:
        lines.append("")
    for head, observed in zip(lines[::2], lines[1::2]):
        w = head.split()
        if len(w) < 10:
            raise SplatwrightError(f"{path}: image line {head!r} needs IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME")
        values = observed.split()
        if len(values) % 3:
            raise SplatwrightError(f"{path}: the 2D points of image {w[0]} are not X Y POINT3D_ID triples")
        obs = np.asarray(values, np.float64).reshape(-1, 3)
        images[int(w[0])] = _image(path, int(w[0]), [float(v) for v in w[1:5]], [float(v) for v in w[5:8]],
                                   int(w[8]), " ".join(w[9:]), obs[:, :2], obs[:, 2])
    return images


def _points_txt(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = _text_rows(path)
    return _points(path, [int(w[0]) for w in rows], [[float(v) for v in w[1:4]] for w in rows],
                   [[int(v) for v in w[4:7]] for w in rows])
