"""A video's frames for structure from motion (photos.py): decoded with PyAV, sampled at a rate (frames a second
of video), each run of near-duplicates (the camera paused) reduced to its sharpest frame, and written as JPEGs
named by their time, so that name order is time order.

The video is checked against the upload limits before its frames are decoded, from what its container declares
(the frame size against `view_pixels`, its length against `video_seconds`, the frames the rate takes from it
against `views`), and again as frames come, since a container's declarations may be missing or wrong. PyAV is
imported only where a video is read: a backend without it does all else.
"""
from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from blender_addon.core.errors import SplatwrightError
from blender_addon.core import reconstruction
from blender_addon.core.reconstruction import DEFAULT_RATE, MAX_RATE, MIN_RATE

FRAMES = "frames"  # OUT/frames: the frames taken, the photos structure from motion runs on
JPEG_QUALITY = 95
THUMBNAIL = (64, 48)  # frames are compared for near-duplicates at this size, where noise and blur average out
NEAR_DUPLICATE = 0.01  # mean absolute difference of thumbnails (0-1) below which a frame repeats the run's first

# (stage, done, total), as photos.ProgressCallback; check(limit, value, what, instead), as photos.LimitCheck
ProgressCallback = Callable[[str, int, int], None]
LimitCheck = Callable[[str, int, str, str], None]


@dataclass(frozen=True)
class Frames:
    folder: Path  # the frames written, NNNNNNNN.jpg: the frame's time in milliseconds
    kept: int  # frames written
    sampled: int  # frames taken at the rate, before near-duplicates were dropped
    seconds: float  # the video's length


def is_video(path: str | Path) -> bool:
    return Path(path).is_file() and reconstruction.is_video(Path(path).name)


def sharpness(gray: np.ndarray) -> float:
    """The variance of the Laplacian of a grayscale image: blur lowers it."""
    g = gray.astype(np.float32)
    laplacian = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1]
    return float(laplacian.var())


def extract_frames(video: str | Path, out: str | Path, check: LimitCheck, progress: ProgressCallback,
                   rate: float = DEFAULT_RATE) -> Frames:
    """The frames of `video` taken every 1/`rate` seconds into `out`/FRAMES (emptied first), each run of
    near-duplicates reduced to its sharpest frame; progress as ("decoding", frames taken, frames expected)."""
    av = _av()
    video, folder = Path(video), Path(out) / FRAMES
    if not MIN_RATE <= rate <= MAX_RATE:
        raise SplatwrightError(f"frame rate {rate}: choose from {MIN_RATE:g} to {MAX_RATE:g} frames a second")
    try:
        container = av.open(str(video))
    except (av.error.FFmpegError, OSError) as e:
        raise SplatwrightError(f"{video}: cannot read the video ({e}); convert it to MP4 (H.264)") from None
    with container:
        if not container.streams.video:
            raise SplatwrightError(f"{video}: the file holds no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        width, height = stream.codec_context.width, stream.codec_context.height
        check("view_pixels", width * height, f"{video}: frames of {width}x{height}", "make the video smaller")
        seconds = (float(stream.duration * stream.time_base) if stream.duration
                   else container.duration / av.time_base if container.duration else 0.0)
        check("video_seconds", math.ceil(seconds), f"{video}: {seconds:.0f} s of video", "cut the video shorter")
        expected = max(1, math.floor(seconds * rate) + 1)
        check("views", expected, f"{video}: {expected} frames at {rate:g} a second",
              "take fewer frames a second (--rate)")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        progress("decoding", 0, expected)
        first = None  # the thumbnail of the current run of near-duplicates' first frame
        best = None  # the run's sharpest frame so far: (sharpness, name, image)
        kept = sampled = 0
        next_time = 0.0
        try:
            for frame in container.decode(stream):
                at = frame.time if frame.time is not None else next_time
                if at + 1e-6 < next_time:
                    continue
                next_time = (math.floor(at * rate) + 1) / rate  # the next slot of the 1/rate grid after this frame
                sampled += 1
                check("video_seconds", math.ceil(at), f"{video}: {at:.0f} s of video", "cut the video shorter")
                check("views", sampled, f"{video}: frames at {rate:g} a second", "take fewer frames a second (--rate)")
                image = frame.to_image()
                check("view_pixels", image.width * image.height, f"{video}: frames of {image.width}x{image.height}",
                      "make the video smaller")
                gray = image.convert("L")
                thumbnail = np.asarray(gray.resize(THUMBNAIL, Image.Resampling.BOX), np.float32) / 255.0
                if first is not None and np.abs(thumbnail - first).mean() >= NEAR_DUPLICATE:
                    _write(best, folder)
                    kept, first, best = kept + 1, None, None
                candidate = (sharpness(np.asarray(gray)), f"{round(at * 1000):08d}.jpg", image)
                first = thumbnail if first is None else first
                best = candidate if best is None or candidate[0] > best[0] else best
                progress("decoding", sampled, max(expected, sampled))
        except av.error.FFmpegError as e:
            raise SplatwrightError(f"{video}: the video cannot be decoded past frame {sampled} ({e}); convert it "
                                   "to MP4 (H.264)") from None
        if best is not None:
            _write(best, folder)
            kept += 1
    progress("decoding", sampled, sampled)
    if not kept:
        raise SplatwrightError(f"{video}: no frames could be decoded; convert it to MP4 (H.264)")
    return Frames(folder, kept, sampled, seconds)


def _write(frame: tuple[float, str, Image.Image], folder: Path) -> None:
    _, name, image = frame
    image.save(folder / name, quality=JPEG_QUALITY)


def _av():
    try:
        import av
    except ImportError:
        raise SplatwrightError("reading a video needs PyAV, which this backend's environment lacks: pip install av, "
                               "or press Set Up Backend in the add-on's preferences") from None
    av.logging.set_level(av.logging.ERROR)  # FFmpeg's own warnings: the progress and the errors say enough
    return av
