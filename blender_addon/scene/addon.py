"""The add-on's place in Blender: its package name (the preferences' key), its preferences, its per-user data
folder and the backend sources it carries."""
from __future__ import annotations

from pathlib import Path

import bpy

from ..logic.environment import backend_sources

ADDON_FOLDER = Path(__file__).resolve().parents[1]
PACKAGE = __package__.rpartition(".")[0]  # splatwright, or bl_ext.<repository>.splatwright for an extension


def data_folder() -> Path:
    """Blender's per-user data folder for the add-on, which outlives its updates: the extension's user folder
    (a 4.2+ extension), else splatwright/ in Blender's user config folder (a legacy add-on)."""
    if PACKAGE.startswith("bl_ext.") and hasattr(bpy.utils, "extension_path_user"):
        return Path(bpy.utils.extension_path_user(PACKAGE, create=True))
    return Path(bpy.utils.user_resource("CONFIG")) / "splatwright"


def sources() -> Path:
    return backend_sources(ADDON_FOLDER)


def prefs(context):
    """The add-on's preferences (ui/preferences.py defines them)."""
    return context.preferences.addons[PACKAGE].preferences
