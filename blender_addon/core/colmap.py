"""COLMAP models read as they are written (standard library + numpy: the add-on imports it): `cameras`, `images`
and `points3D`, as .bin or .txt, in `sparse/0/` (what `colmap mapper` writes) or `sparse/` (what `colmap
image_undistorter` writes) of a capture folder whose `images/` holds the photos.

COLMAP's conventions are ours: images store world-to-camera rotations (as quaternions w, x, y, z) and
translations of OpenCV-style cameras (x right, y down, z forward), and pixel coordinates put the centre of the
top-left pixel at (0.5, 0.5). So poses and intrinsics carry over as they are; the world frame is COLMAP's.
PINHOLE and SIMPLE_PINHOLE cameras are read. A model whose cameras have lens distortion (UNDISTORTABLE) is
read from its undistorted copy, `undistorted/` beside its images, which pycolmap's undistortion makes (undistort,
given the pycolmap module: the backend imports it, Blender's Python rarely has it); other distortion models are
refused, with the command that undistorts them. Images are taken in name order and every 8th (the first, the
ninth, ...) is held out for testing, as 3DGS does with such captures.

Models come from anywhere, so what they declare is checked before it is used: a binary file's record counts
against the bytes the file holds, before anything is allocated for them; camera sides against MAX_IMAGE_SIDE, as
rendered frames are; and image names, which COLMAP writes relative to the images folder, must stay inside it
(image_path), so that a model cannot make the backend or the add-on read a file elsewhere.
"""
from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .cameras import Camera, check_rigid, intrinsics, rigid_inverse
from .codecs import MAX_IMAGE_SIDE
from .errors import SplatwrightError

IMAGES_FOLDER = "images"
TEST_EVERY = 8
PINHOLE = ("SIMPLE_PINHOLE", "PINHOLE")
UNDISTORTABLE = ("SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV", "OPENCV_FISHEYE")
UNDISTORTED = "undistorted"  # beside images/: a distorted model's capture, undistorted
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


def image_path(folder: str | Path, name: str) -> Path:
    """The file of the image `name` of a model in the images folder `folder`; refused unless the name is a path
    inside the folder (relative, no `..`, no drive, with either separator)."""
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith(("/", "\\")) or ":" in parts[0] or any(p in ("", ".", "..") for p in parts):
        raise SplatwrightError(f"image name {name!r} is not a path inside the {IMAGES_FOLDER} folder; COLMAP names "
                               "images relative to it")
    return Path(folder, *parts)


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
            "--output_path undistorted, then use the undistorted folder")
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
    return [im for i, im in enumerate(ordered) if split_of(i) == split]


def split_of(index: int) -> str:
    """The split of the image at `index` in name order: the first, the ninth, ... are held out."""
    return "test" if index % TEST_EVERY == 0 else "train"


def capture_folders(folder: str | Path) -> tuple[Path, Path]:
    """(capture folder, model folder) of a folder the user chose: a capture folder (`images/` beside `sparse/0/` or
    `sparse/`) or its model folder itself."""
    folder = Path(folder)
    if (folder / "cameras.bin").is_file() or (folder / "cameras.txt").is_file():
        return (folder.parent.parent if folder.parent.name == "sparse" else folder.parent), folder
    model = find_model(folder)
    if model is None:
        raise SplatwrightError(f"{folder}: no COLMAP model (cameras.bin or cameras.txt) here or in sparse/0 or "
                               "sparse; choose the capture folder or its model folder")
    return folder, model


def distortion(root: Path, model: Model) -> list[str]:
    """The camera models with lens distortion of the capture `root`'s model (none for a pinhole one); refused where
    one is not UNDISTORTABLE."""
    distorted = sorted({cam.model for cam in model.cameras.values()} - set(PINHOLE))
    unknown = [name for name in distorted if name not in UNDISTORTABLE]
    if unknown:
        raise SplatwrightError(
            f"{root}: COLMAP camera model {', '.join(unknown)} has lens distortion that is not undistorted here "
            f"({', '.join(UNDISTORTABLE)} are); undistort the capture first: colmap image_undistorter --image_path "
            "images --input_path sparse/0 --output_path undistorted, then use the undistorted folder")
    return distorted


def undistorted_copy(root: Path) -> Path | None:
    """root/UNDISTORTED where it holds a model at least as new as the capture's own, else None."""
    made, folder = find_model(root / UNDISTORTED), find_model(root)
    newest_input = max(path.stat().st_mtime for path in folder.iterdir() if path.is_file())
    if made is not None and min(path.stat().st_mtime for path in made.iterdir()) >= newest_input:
        return root / UNDISTORTED
    return None


def make_undistorted(pycolmap, root: Path) -> Path:
    """root/UNDISTORTED made anew from the capture `root` (undistort), atomically: a half-made copy is never read."""
    partial = root / (UNDISTORTED + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    undistort(pycolmap, find_model(root), root / IMAGES_FOLDER, partial)
    shutil.rmtree(root / UNDISTORTED, ignore_errors=True)
    partial.rename(root / UNDISTORTED)
    return root / UNDISTORTED


def undistort(pycolmap, model_folder: Path, images: Path, out: Path) -> None:
    """The model in `model_folder` with its photos in `images` undistorted to pinhole cameras by `pycolmap` (the
    module), written as `colmap image_undistorter` writes them: OUT/images and OUT/sparse, sides at most
    MAX_IMAGE_SIDE; its stereo/ folder and scripts, for COLMAP's dense reconstruction, are removed."""
    for old in (out / IMAGES_FOLDER, out / "sparse"):
        shutil.rmtree(old, ignore_errors=True)
    options = pycolmap.UndistortCameraOptions()
    options.max_image_size = MAX_IMAGE_SIDE
    pycolmap.undistort_images(str(out), str(model_folder), str(images), undistort_options=options)
    shutil.rmtree(out / "stereo", ignore_errors=True)
    for script in out.glob("run-colmap-*.sh"):
        script.unlink()


# --- in Blender -------------------------------------------------------------------------------------------------
#
# An imported model's objects keep COLMAP's coordinates; one parent object's matrix (`placement`) takes COLMAP's
# world to Blender's, which is Z up. COLMAP's cameras look down their +Z with their -Y up in the image, and its
# mapper gives the first camera it places no rotation, so the world's -Y is up where that photo was taken level.
# Guessed from the cameras instead, up is where their images' up points on average.

UP_AXES = ("CAMERAS", "MINUS_Y", "KEEP")  # the cameras' mean up direction, COLMAP's -Y, or COLMAP's axes as they are
MINUS_Y_UP = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, -1.0, 0.0]])  # -Y to +Z, +Z to +Y


def placement(cameras: list[Camera], xyz: np.ndarray, up_axis: str, centre: bool, scale: float) -> np.ndarray:
    """The 4x4 matrix from COLMAP's world to Blender's: turned so that `up_axis` points up (+Z), scaled by
    `scale` and, with `centre`, moved so that the points' median (the cameras' mean without points) is at the
    origin."""
    if up_axis not in UP_AXES:
        raise SplatwrightError(f"unknown up axis {up_axis!r}; choose one of {', '.join(UP_AXES)}")
    if not scale > 0:
        raise SplatwrightError(f"scale {scale}: choose a positive number")
    rotation = np.eye(3)
    if up_axis == "MINUS_Y":
        rotation = MINUS_Y_UP
    elif up_axis == "CAMERAS" and cameras:
        up = -np.mean([cam.c2w[:3, 1] for cam in cameras], axis=0)
        if np.linalg.norm(up) > 1e-6:  # cameras turned every way have no mean up: COLMAP's axes stay
            rotation = rotation_onto(up, np.array([0.0, 0.0, 1.0]))
    middle = np.zeros(3)
    if centre and len(xyz):
        middle = np.median(np.asarray(xyz, np.float64), axis=0)
    elif centre and cameras:
        middle = np.mean([cam.position for cam in cameras], axis=0)
    m = np.eye(4)
    m[:3, :3] = scale * rotation
    m[:3, 3] = -scale * rotation @ middle
    return m


def rotation_onto(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The smallest rotation turning direction `a` onto direction `b`."""
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    v, c = np.cross(a, b), float(a @ b)
    if c < -1.0 + 1e-9:  # opposite: half a turn about any axis perpendicular to them
        axis = np.cross(a, [1.0, 0.0, 0.0] if abs(a[0]) < 0.9 else [0.0, 1.0, 0.0])
        axis /= np.linalg.norm(axis)
        return 2.0 * np.outer(axis, axis) - np.eye(3)
    k = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
    return np.eye(3) + k + k @ k / (1.0 + c)


# --- the files ------------------------------------------------------------------------------------------------

class _Reader:
    """Little-endian values from the start of a binary file on."""

    def __init__(self, path: Path):
        self.path, self.data, self.offset = path, path.read_bytes(), 0

    def count(self, record_bytes: int, what: str) -> int:
        """A count of records of at least `record_bytes` each; ValueError where the rest of the file cannot hold
        them (read_model says the model is unreadable)."""
        count = self.read("Q")[0]
        left = len(self.data) - self.offset
        if count * record_bytes > left:
            raise ValueError(f"{self.path.name} declares {count:,} {what}, but its {left:,} bytes left hold at most "
                             f"{left // record_bytes:,}")
        return count

    def read(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype, count: int, what: str) -> np.ndarray:
        dtype = np.dtype(dtype)
        if count * dtype.itemsize > len(self.data) - self.offset:
            raise ValueError(f"{self.path.name} declares {count:,} {what}, more than its "
                             f"{len(self.data) - self.offset:,} bytes left hold")
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
    if width > MAX_IMAGE_SIDE or height > MAX_IMAGE_SIDE:
        raise SplatwrightError(f"{path}: camera {camera_id} is {width}x{height} pixels; sides are at most "
                               f"{MAX_IMAGE_SIDE}, as rendered frames' are (colmap image_undistorter "
                               f"--max_image_size {MAX_IMAGE_SIDE} makes smaller images and cameras)")
    return ColmapCamera(model, int(width), int(height), tuple(float(p) for p in params))


def _image(path: Path, image_id: int, q, t, camera_id: int, name: str, xys, point_ids) -> ColmapImage:
    q, t = np.asarray(q, np.float64), np.asarray(t, np.float64)
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(t))) or np.linalg.norm(q) < 1e-12:
        raise SplatwrightError(f"{path}: image {image_id} ({name}) has a NaN or zero pose")
    try:
        image_path(IMAGES_FOLDER, name)
    except SplatwrightError as e:
        raise SplatwrightError(f"{path}: image {image_id}: {e}") from None
    return ColmapImage(name, int(camera_id), q, t, np.asarray(xys, np.float64).reshape(-1, 2),
                       np.asarray(point_ids, np.int64))


def _points(path: Path, ids: list, xyz: list, rgb: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xyz = np.asarray(xyz, np.float64).reshape(-1, 3)
    if not np.all(np.isfinite(xyz)):
        raise SplatwrightError(f"{path}: some points have NaN or infinite positions")
    return xyz.astype(np.float32), np.asarray(rgb, np.uint8).reshape(-1, 3), np.asarray(ids, np.int64)


def _cameras_bin(path: Path) -> dict[int, ColmapCamera]:
    r, cameras = _Reader(path), {}
    for _ in range(r.count(struct.calcsize("<iiQQ"), "cameras")):
        camera_id, model_id, width, height = r.read("iiQQ")
        if model_id not in MODELS:
            raise SplatwrightError(f"{path}: camera {camera_id} has the unknown model id {model_id}")
        name, count = MODELS[model_id]
        cameras[camera_id] = _camera(path, camera_id, name, width, height, r.read(f"{count}d"))
    r.end(path)
    return cameras


def _images_bin(path: Path) -> dict[int, ColmapImage]:
    r, images = _Reader(path), {}
    for _ in range(r.count(struct.calcsize("<i7di") + 1 + 8, "images")):  # pose, name's end, observations
        image_id, *pose, camera_id = r.read("i7di")
        name = r.name()
        observations = r.array([("xy", "<f8", 2), ("id", "<i8")], r.read("Q")[0], f"observations of image {image_id}")
        images[image_id] = _image(path, image_id, pose[:4], pose[4:], camera_id, name, observations["xy"],
                                  observations["id"])
    r.end(path)
    return images


def _points_bin(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, ids, xyz, rgb = _Reader(path), [], [], []
    for _ in range(r.count(struct.calcsize("<Q3d3BdQ"), "points")):
        point_id, x, y, z, red, green, blue, _error, track = r.read("Q3d3BdQ")
        r.array("<i4", 2 * track, f"track entries of point {point_id}")  # (image id, point index) pairs
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
