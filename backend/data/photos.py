"""Structure from motion through pycolmap: a folder of photos, or a video, to a COLMAP capture folder that the
COLMAP loader (colmap.py) reads, with undistorted images and the sparse points that seed training.

The stages, each reporting progress as (stage, done, total):

0. decoding, for a video: its frames taken at a rate into OUT/frames (video.py), the photos from then on.
1. features: SIFT on each photo; a small photo (longest side under SMALL_PHOTO) is found features on at twice its
   size (SIFT finds few on a small photo of a smooth subject), their positions then scaled back to the photo.
   Photos of one camera share one camera model (SIMPLE_RADIAL, its focal length from EXIF where the photo has it,
   else pycolmap's guess): photos whose sizes and EXIF make, model and focal length agree are one camera.
2. matching: every pair of photos or frames up to EXHAUSTIVE_UP_TO (a video that comes back to where it started
   is then joined end to start, as sequential matching alone would not); beyond, each photo with its neighbours in
   name order (sequential matching, for photos taken walking around and a video's frames in time order); guided by
   each pair's verified geometry.
3. mapping: incremental mapping; the model that registers the most photos is kept, before undistortion in
   OUT/distorted/sparse/0. Where a camera's focal length was a guess (no EXIF), the mapping runs twice: the
   first model's refined focal length becomes the camera's known one, the pairs are verified again with it
   (a calibrated pair's geometry is the stronger), and the second mapping starts from there (self-calibration).
4. undistortion: the kept model's photos resampled to a pinhole camera, into OUT/images and OUT/sparse, the
   layout `colmap image_undistorter` writes (without its stereo/ folder and scripts, which training needs not;
   blender_addon/core/colmap.py's undistort, which the add-on also runs).

The COLMAP database (OUT/database.db) stays in the output folder: run again on the same photos (names and bytes),
the features and matches it holds are reused and only mapping and undistortion run again; other photos start a
new database. pycolmap is imported only where it is used: a backend
without it trains and serves as before. A run stops at its next progress report once its `cancel` event is set.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from blender_addon.core.codecs import MAX_IMAGE_SIDE
from blender_addon.core import colmap as core_colmap
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.reconstruction import PHOTO_SUFFIXES, VIDEO_SUFFIXES, is_photo
from .video import DEFAULT_RATE, extract_frames, is_video

DATABASE = "database.db"
DISTORTED = "distorted"  # OUT/distorted/sparse/0: the mapper's model, before undistortion
PAIRS = "pairs.txt"  # the image pairs matched last, one "name1 name2" a line
VIDEO_RECORD = "video.json"  # which video, and at which rate, the database's frames were taken from
PHOTOS_RECORD = "photos.json"  # the photos the database holds: each one's name and the SHA-256 of its bytes
EXHAUSTIVE_UP_TO = 100  # photos or frames matched every pair with every pair; more are matched sequentially
EXTRACT_CHUNK = 8  # photos per feature-extraction call, between progress reports
SMALL_PHOTO = 1000  # photos whose longest side is under this many pixels are found features on at twice their size
UPSCALED = "upscaled"  # OUT/upscaled: the small photos at twice their size while their features are found
MATCH_CHUNK = 200  # image pairs per matching call, between progress reports
MIN_REGISTERED = 3  # a model needs at least this many photos, and at least half of them, to train on
PHOTOS_ADVICE = ("the photos likely overlap too little or are blurred: take them closer together, each seeing much of "
                 "what its neighbours see, sharp and well lit")
VIDEO_ADVICE = ("the camera likely moves too fast or too little, or the frames are blurred: move slowly around the "
                "subject, sharp and well lit, or take more frames a second")

# (stage, done, total), called as each stage goes on
ProgressCallback = Callable[[str, int, int], None]
# check(limit, value, what, instead): raises SplatwrightError where `value` is over the limit (the server's Limits)
LimitCheck = Callable[[str, int, str, str], None]


class Cancelled(SplatwrightError):
    """A reconstruction stopped because its cancel event was set."""


@dataclass(frozen=True)
class Reconstruction:
    folder: Path  # the capture folder: images/ and sparse/
    registered: int  # photos in the model
    photos: int  # photos in the input folder, or frames taken from the video
    points: int  # sparse 3D points
    seconds: dict[str, float]  # time each stage took
    sampled: int | None = None  # for a video: the frames taken at the rate, before near-duplicates were dropped


@dataclass(frozen=True)
class Photo:
    name: str  # the file's name in the photos folder
    width: int
    height: int
    camera: tuple  # what makes photos one camera: size, EXIF make, model and focal length


def list_photos(folder: Path, check: LimitCheck) -> list[Photo]:
    """The photos of `folder` (not its subfolders), in name order, each read only as far as its size and EXIF;
    the count and each photo's pixels checked against the upload limits `views` and `view_pixels`."""
    if not folder.is_dir():
        raise SplatwrightError(f"{folder}: neither a folder of photos nor a video ({', '.join(sorted(VIDEO_SUFFIXES))}"
                               " files)")
    files = sorted(p for p in folder.iterdir() if p.is_file() and is_photo(p.name))
    if not files:
        raise SplatwrightError(f"{folder}: no photos ({', '.join(sorted(PHOTO_SUFFIXES))} files)")
    check("views", len(files), f"{folder}: photos", "choose fewer photos")
    photos = []
    for path in files:
        try:
            with Image.open(path) as im:
                exif = im.getexif()
                focal = exif.get_ifd(0x8769).get(0x920A)  # ExifIFD FocalLength
                photos.append(Photo(path.name, im.width, im.height,
                                    (im.width, im.height, exif.get(0x010F), exif.get(0x0110), focal)))
        except (OSError, Image.DecompressionBombError) as e:
            raise SplatwrightError(f"{path}: cannot read the photo ({e}); remove it or convert it to JPEG") from None
        check("view_pixels", photos[-1].width * photos[-1].height, f"{path}: {photos[-1].width}x{photos[-1].height}",
              "make the photos smaller")
    return photos


def reconstruct(source: str | Path, out: str | Path, check: LimitCheck,
                progress: ProgressCallback = lambda stage, done, total: None,
                max_image_size: int = MAX_IMAGE_SIDE, rate: float = DEFAULT_RATE,
                cancel: threading.Event | None = None) -> Reconstruction:
    """Structure from motion from the photos in the folder `source`, or from the frames of the video `source`
    taken `rate` a second, to a COLMAP capture folder `out` (the module's docstring says how).
    `max_image_size`: the longest side features are found at (photos are scaled down to it for SIFT, and a small
    photo is doubled only where twice its size fits; the undistorted images keep their size up to
    MAX_IMAGE_SIDE). Cancelled once `cancel` is set."""
    pycolmap = pycolmap_module()
    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    database = out / DATABASE
    seconds, started = {}, [time.monotonic()]

    def report(stage: str, done: int, total: int) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"structure from motion of {source} cancelled during {stage}")
        progress(stage, done, total)

    def stage_done(stage: str) -> None:
        now = time.monotonic()
        seconds[stage] = round(now - started[0], 2)
        started[0] = now

    frames = None
    if is_video(source):
        _forget_another_video(out, source, rate)
        frames = extract_frames(source, out, check, report, rate)
        stage_done("decoding")
    folder = frames.folder if frames else source
    photos = list_photos(folder, check)
    _forget_other_photos(out, folder, photos)
    _extract(pycolmap, database, folder, out / UPSCALED, photos, max_image_size, report)
    stage_done("features")
    pairs = _pairs(pycolmap, database, len(photos))
    _match(pycolmap, database, out / PAIRS, pairs, report)
    stage_done("matching")
    model = _map(pycolmap, database, folder, out / DISTORTED, len(photos), report,
                 lambda: _match(pycolmap, database, out / PAIRS, pairs, lambda *a: None))
    registered = model.num_reg_images() if model is not None else 0
    if registered < MIN_REGISTERED or 2 * registered < len(photos):
        raise SplatwrightError(
            f"{source}: structure from motion registered {registered} of {len(photos)} "
            f"{'frames' if frames else 'photos'}, too few to train on (at least {MIN_REGISTERED} and half of them); "
            + (VIDEO_ADVICE if frames else PHOTOS_ADVICE))
    stage_done("mapping")
    report("undistortion", 0, model.num_reg_images())
    undistort(model_folder=out / DISTORTED / "sparse" / "0", images=folder, out=out)
    report("undistortion", model.num_reg_images(), model.num_reg_images())
    stage_done("undistortion")
    return Reconstruction(out, model.num_reg_images(), len(photos), model.num_points3D(), seconds,
                          frames.sampled if frames else None)


def similarity(source: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """The similarity (scale s, rotation R, translation t) taking the points `source` (N, 3) closest to `target`
    (N, 3) in the least-squares sense, s R x + t (Umeyama 1991)."""
    mu_s, mu_t = source.mean(axis=0), target.mean(axis=0)
    a, b = source - mu_s, target - mu_t
    u, d, vt = np.linalg.svd(b.T @ a / len(source))
    flip = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    rotation = u @ flip @ vt
    scale = float(np.trace(np.diag(d) @ flip) / (a ** 2).sum(axis=1).mean())
    return scale, rotation, mu_t - scale * rotation @ mu_s


def undistort(model_folder: Path, images: Path, out: Path) -> None:
    """colmap.undistort through this backend's pycolmap."""
    core_colmap.undistort(pycolmap_module(), model_folder, images, out)


def _forget_another_video(out: Path, video: Path, rate: float) -> None:
    """Remove the database of another video, or of other frames of this one: its features belong to the frames'
    names, which name other frames now."""
    stat = video.stat()
    _keep_database_of(out, VIDEO_RECORD, {"video": str(video.resolve()), "bytes": stat.st_size,
                                          "modified_ns": stat.st_mtime_ns, "rate": rate})


def _forget_other_photos(out: Path, folder: Path, photos: list[Photo]) -> None:
    """Remove the database of other photos (a photo more or less, or other bytes under a name): the mapper maps
    every photo the database holds, and features are found only for the names it does not hold yet."""
    digests = {}
    for photo in photos:
        with open(folder / photo.name, "rb") as file:
            digests[photo.name] = hashlib.file_digest(file, "sha256").hexdigest()
    _keep_database_of(out, PHOTOS_RECORD, digests)


def _keep_database_of(out: Path, name: str, taken: dict) -> None:
    """Remove OUT's database unless its record `name` says it was made from `taken`; then record `taken`."""
    record = out / name
    try:
        before = json.loads(record.read_text())
    except (OSError, ValueError):
        before = None
    if before != taken:
        (out / DATABASE).unlink(missing_ok=True)
        record.write_text(json.dumps(taken))


def pycolmap_module():
    """pycolmap, quiet and seeded."""
    try:
        import pycolmap
    except ImportError:
        raise SplatwrightError("structure from motion needs pycolmap, which this backend's environment lacks: "
                               "pip install pycolmap, or press Set Up Backend in the add-on's preferences") from None
    pycolmap.logging.minloglevel = pycolmap.logging.FATAL  # COLMAP's own log lines: the progress and errors say enough
    pycolmap.set_random_seed(0)  # RANSAC and the mapper's choices: a run repeats
    return pycolmap


def upscale_factor(photo: Photo, max_image_size: int) -> int:
    """How many times its size a photo is found features on: 2 for a small photo (SMALL_PHOTO) where twice its
    size fits `max_image_size`, else 1."""
    longest = max(photo.width, photo.height)
    return 2 if longest < SMALL_PHOTO and 2 * longest <= max_image_size else 1


def _extract(pycolmap, database: Path, folder: Path, upscaled: Path, photos: list[Photo], max_image_size: int,
             progress: ProgressCallback) -> None:
    """SIFT features of every photo not yet in the database, one camera for each group of photos of one camera;
    a small photo's found on a copy at twice its size in `upscaled` (upscale_factor), then scaled back."""
    options = pycolmap.FeatureExtractionOptions()
    options.max_image_size = max_image_size
    with pycolmap.Database.open(str(database)) as db:
        new = [photo for photo in photos if not db.exists_image(photo.name)]
    groups: dict[tuple, list[Photo]] = {}
    for photo in new:
        groups.setdefault(photo.camera, []).append(photo)
    done = len(photos) - len(new)
    progress("features", done, len(photos))
    for group in groups.values():
        factor = upscale_factor(group[0], max_image_size)
        source = upscaled if factor > 1 else folder
        camera_id = -1  # the group's camera, once its first photos made it
        for start in range(0, len(group), EXTRACT_CHUNK):
            chunk = [photo.name for photo in group[start:start + EXTRACT_CHUNK]]
            if factor > 1:
                _upscale(folder, upscaled, chunk, factor)
            reader = pycolmap.ImageReaderOptions()
            reader.existing_camera_id = camera_id
            pycolmap.extract_features(str(database), str(source), image_names=chunk,
                                      camera_mode=pycolmap.CameraMode.SINGLE, reader_options=reader,
                                      extraction_options=options, device=pycolmap.Device.cpu)
            with pycolmap.Database.open(str(database)) as db:
                known = [db.read_image_with_name(n) for n in chunk if db.exists_image(n)]
            if camera_id == -1 and known:
                camera_id = known[0].camera_id
            done += len(chunk)
            progress("features", done, len(photos))
        if factor > 1 and camera_id != -1:
            _scale_back(pycolmap, database, camera_id, group, factor)
    shutil.rmtree(upscaled, ignore_errors=True)


def _upscale(folder: Path, upscaled: Path, names: list[str], factor: int) -> None:
    """The photos `names` of `folder` at `factor` times their size into `upscaled`, with their EXIF (from which
    pycolmap takes a focal length, in pixels of the size it reads)."""
    shutil.rmtree(upscaled, ignore_errors=True)  # the chunk before's
    upscaled.mkdir(parents=True)
    for name in names:
        with Image.open(folder / name) as im:
            exif = im.getexif()
            im.resize((factor * im.width, factor * im.height), Image.Resampling.LANCZOS).save(
                upscaled / name, quality=95, exif=exif)


def _scale_back(pycolmap, database: Path, camera_id: int, group: list[Photo], factor: int) -> None:
    """The camera and keypoints of photos whose features were found at `factor` times their size, at their own
    size (positions and shapes divided by `factor`: COLMAP's coordinates scale with the image)."""
    with pycolmap.Database.open(str(database)) as db:
        camera = db.read_camera(camera_id)
        camera.rescale(group[0].width, group[0].height)
        db.update_camera(camera)
        for photo in group:
            if db.exists_image(photo.name):
                image_id = db.read_image_with_name(photo.name).image_id
                db.update_keypoints(image_id, db.read_keypoints(image_id) / np.float32(factor))


def _pairs(pycolmap, database: Path, count: int) -> list[tuple[str, str]]:
    """The pairs of photos to match: every pair up to EXHAUSTIVE_UP_TO photos, else each with its neighbours in
    name order."""
    with pycolmap.Database.open(str(database)) as db:
        if count <= EXHAUSTIVE_UP_TO:
            generator = pycolmap.ExhaustivePairGenerator(pycolmap.ExhaustivePairingOptions(), db)
        else:
            generator = pycolmap.SequentialPairGenerator(pycolmap.SequentialPairingOptions(), db)
        names = {image.image_id: image.name for image in db.read_all_images()}
        return [(names[a], names[b]) for a, b in generator.all_pairs()]


def _match(pycolmap, database: Path, pairs_file: Path, pairs: list[tuple[str, str]],
           progress: ProgressCallback) -> None:
    """Match `pairs` and verify their geometry; pairs matched before are not matched again, and those whose
    geometry is not in the database are verified again."""
    matching = pycolmap.FeatureMatchingOptions()
    matching.guided_matching = True  # after verification, matches along the epipolar lines too: more photos register
    progress("matching", 0, len(pairs))
    for start in range(0, len(pairs), MATCH_CHUNK):
        chunk = pairs[start:start + MATCH_CHUNK]
        pairs_file.write_text("".join(f"{a} {b}\n" for a, b in chunk))
        pairing = pycolmap.ImportedPairingOptions()
        pairing.match_list_path = str(pairs_file)
        pycolmap.match_image_pairs(str(database), matching_options=matching, pairing_options=pairing,
                                   device=pycolmap.Device.cpu)
        progress("matching", start + len(chunk), len(pairs))


def _map(pycolmap, database: Path, folder: Path, out: Path, count: int, progress: ProgressCallback,
         verify_again: Callable[[], None]):
    """Incremental mapping, twice where a camera's focal length is a guess (the module's docstring); the model
    registering the most photos (None where it made none), written to OUT/sparse/0 (`out` is the distorted
    folder). `verify_again()` verifies the pairs whose geometry was cleared."""
    shutil.rmtree(out, ignore_errors=True)
    models = out / "models"
    with pycolmap.Database.open(str(database)) as db:
        guessed = {camera.camera_id for camera in db.read_all_cameras() if not camera.has_prior_focal_length}
    total = (2 if guessed else 1) * count
    placed = [0]

    def next_image() -> None:
        placed[0] += 1
        progress("mapping", min(placed[0], total), total)

    progress("mapping", 0, total)
    model = _largest_model(pycolmap, database, folder, models, next_image)
    calibrated = guessed & set(model.cameras) if model is not None else set()
    if calibrated:
        with pycolmap.Database.open(str(database)) as db:
            for camera_id in calibrated:
                camera = db.read_camera(camera_id)
                params = camera.params
                for i in camera.focal_length_idxs():
                    params[i] = model.cameras[camera_id].params[i]
                camera.params, camera.has_prior_focal_length = params, True
                db.update_camera(camera)
            db.clear_two_view_geometries()
        verify_again()
        placed[0] = count
        second = _largest_model(pycolmap, database, folder, models, next_image)
        if second is not None and second.num_reg_images() >= model.num_reg_images():
            model = second
    if model is None:
        return None
    progress("mapping", total, total)
    final = out / "sparse" / "0"
    final.mkdir(parents=True)
    model.write(str(final))
    shutil.rmtree(models)
    return model


def _largest_model(pycolmap, database: Path, folder: Path, models: Path, next_image: Callable[[], None]):
    """Incremental mapping into `models` (emptied first); the model that registers the most photos, or None."""
    shutil.rmtree(models, ignore_errors=True)
    models.mkdir(parents=True)
    found = pycolmap.incremental_mapping(str(database), str(folder), str(models), next_image_callback=next_image)
    return max(found.values(), key=lambda m: m.num_reg_images(), default=None)
