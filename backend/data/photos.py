"""Structure from motion through pycolmap: a folder of photos, or a video, to a COLMAP capture folder that the
COLMAP loader (colmap.py) reads, with undistorted images and the sparse points that seed training.

The stages, each reporting progress as (stage, done, total):

0. decoding, for a video: its frames taken at a rate into OUT/frames (video.py), the photos from then on.
1. features: SIFT on each photo. Photos of one camera share one camera model (SIMPLE_RADIAL, its focal length
   from EXIF where the photo has it, else pycolmap's guess): photos whose sizes and EXIF make, model and focal
   length agree are one camera.
2. matching: every pair of photos up to EXHAUSTIVE_UP_TO photos; beyond, and for a video's frames whatever their
   count, each photo with its neighbours in name order (sequential matching, for photos taken walking around);
   guided by each pair's verified geometry.
3. mapping: incremental mapping; the model that registers the most photos is kept, before undistortion in
   OUT/distorted/sparse/0.
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
EXHAUSTIVE_UP_TO = 100  # photos matched every pair with every pair; more are matched sequentially
EXTRACT_CHUNK = 8  # photos per feature-extraction call, between progress reports
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
    `max_image_size`: the longest side features are found at (photos are scaled down to it for SIFT; the
    undistorted images keep their size up to MAX_IMAGE_SIDE). Cancelled once `cancel` is set."""
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
    _extract(pycolmap, database, folder, photos, max_image_size, report)
    stage_done("features")
    _match(pycolmap, database, out / PAIRS, len(photos), frames is not None, report)
    stage_done("matching")
    model = _map(pycolmap, database, folder, out / DISTORTED, len(photos), report)
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


def _extract(pycolmap, database: Path, folder: Path, photos: list[Photo], max_image_size: int,
             progress: ProgressCallback) -> None:
    """SIFT features of every photo not yet in the database, one camera for each group of photos of one camera."""
    options = pycolmap.FeatureExtractionOptions()
    options.max_image_size = max_image_size
    groups: dict[tuple, list[str]] = {}
    for photo in photos:
        groups.setdefault(photo.camera, []).append(photo.name)
    done = 0
    progress("features", done, len(photos))
    for names in groups.values():
        camera_id = -1  # the group's camera, once its first photos made it
        for start in range(0, len(names), EXTRACT_CHUNK):
            chunk = names[start:start + EXTRACT_CHUNK]
            reader = pycolmap.ImageReaderOptions()
            reader.existing_camera_id = camera_id
            pycolmap.extract_features(str(database), str(folder), image_names=chunk,
                                      camera_mode=pycolmap.CameraMode.SINGLE, reader_options=reader,
                                      extraction_options=options, device=pycolmap.Device.cpu)
            with pycolmap.Database.open(str(database)) as db:
                known = [db.read_image_with_name(n) for n in chunk if db.exists_image(n)]
            if camera_id == -1 and known:
                camera_id = known[0].camera_id
            done += len(chunk)
            progress("features", done, len(photos))


def _match(pycolmap, database: Path, pairs_file: Path, count: int, sequential: bool,
           progress: ProgressCallback) -> None:
    """Match the pairs of photos the pairing chooses (`sequential`: each with its neighbours, whatever the count);
    pairs matched before are not matched again."""
    with pycolmap.Database.open(str(database)) as db:
        if count <= EXHAUSTIVE_UP_TO and not sequential:
            generator = pycolmap.ExhaustivePairGenerator(pycolmap.ExhaustivePairingOptions(), db)
        else:
            generator = pycolmap.SequentialPairGenerator(pycolmap.SequentialPairingOptions(), db)
        names = {image.image_id: image.name for image in db.read_all_images()}
        pairs = [(names[a], names[b]) for a, b in generator.all_pairs()]
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


def _map(pycolmap, database: Path, folder: Path, out: Path, count: int, progress: ProgressCallback):
    """Incremental mapping; the model registering the most photos (None where it made none), written to
    OUT/sparse/0 (`out` is the distorted folder)."""
    shutil.rmtree(out, ignore_errors=True)
    models = out / "models"
    models.mkdir(parents=True)
    placed = [0]

    def next_image() -> None:
        placed[0] += 1
        progress("mapping", min(placed[0], count), count)

    progress("mapping", 0, count)
    found = pycolmap.incremental_mapping(str(database), str(folder), str(models), next_image_callback=next_image)
    model = max(found.values(), key=lambda m: m.num_reg_images(), default=None)
    if model is None:
        return None
    progress("mapping", count, count)
    final = out / "sparse" / "0"
    final.mkdir(parents=True)
    model.write(str(final))
    shutil.rmtree(models)
    return model
