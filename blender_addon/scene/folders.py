"""Where captures go: the Folder setting, a folder beside the .blend by default (//splatwright). While the file
is unsaved that has no place, so captures go to the add-on's data folder (captures/), which outlives a reboot as
a temporary folder may not; the panel says so, and once the file is saved it offers to move them beside it."""
from __future__ import annotations

import shutil
from pathlib import Path

import bpy
from bpy.app.handlers import persistent

from . import live
from .addon import data_folder

CAPTURES = "captures"


def captures_home() -> Path:
    """Where an unsaved file's captures go."""
    return data_folder() / CAPTURES


def unsaved_captures(folder: str) -> bool:
    """The Folder setting is beside the .blend, and the .blend is not saved: captures go to captures_home()."""
    return folder.startswith("//") and not bpy.data.filepath


def dataset_root(folder: str) -> Path:
    """The folder a capture writes its dataset into."""
    return captures_home() if unsaved_captures(folder) else Path(bpy.path.abspath(folder))


def movable_capture(scene) -> Path | None:
    """The scene's last capture where it went to captures_home() while the file was unsaved, and the file is
    saved now with Folder beside it; else None."""
    s = scene.splatwright
    if not bpy.data.filepath or not s.capture_folder or not s.folder.startswith("//"):
        return None
    folder = Path(s.capture_folder)
    try:
        return folder if folder.is_dir() and folder.resolve().parent == captures_home().resolve() else None
    except OSError:
        return None


def move_capture(scene) -> Path:
    """Move the scene's last capture beside the saved .blend (into its Folder); the new place."""
    s = scene.splatwright
    source = movable_capture(scene)
    target_root = Path(bpy.path.abspath(s.folder))
    target_root.mkdir(parents=True, exist_ok=True)
    target = target_root / source.name
    if target.exists():
        raise FileExistsError(f"{target} exists already")
    shutil.move(str(source), str(target))
    s.capture_folder = str(target)
    return target


@persistent
def offer_after_save(*args) -> None:
    """A saved file whose last capture is in the data folder: say that the panel offers to move it."""
    scene = bpy.context.scene
    if scene is not None and movable_capture(scene) is not None:
        live.report("INFO", f"this file's capture {Path(scene.splatwright.capture_folder).name} is in the add-on's "
                            "data folder: Move Captures Beside .blend (Splats tab) moves it beside the file")


def register():
    bpy.app.handlers.save_post.append(offer_after_save)


def unregister():
    if offer_after_save in bpy.app.handlers.save_post:
        bpy.app.handlers.save_post.remove(offer_after_save)
