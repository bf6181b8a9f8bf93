"""Splatwright: capture the scene's cameras and renders, train 3D Gaussian Splats in a backend process and
view them. Installs as a legacy add-on (bl_info, Blender 3.4+) or an extension (blender_manifest.toml, 4.2+)."""

bl_info = {
    "name": "Splatwright",
    "author": "Splatwright developers",
    "version": (0, 1, 0),
    "blender": (3, 4, 0),
    "location": "3D Viewport > Sidebar > Splats",
    "description": "Train 3D Gaussian Splats from the scene's cameras and renders, and view them",
    "category": "Render",
}



def _modules():
    """The modules that need bpy, in registration order. Imported here rather than at the top so that the
    package and its bpy-free modules (core/, dataset, colors, frames, placement, training, runtime) import without
    Blender, as the backend and the tests import them."""
    from . import (colmap_import, composite, engine, io_formats, live, operators, overlay, panels, preferences,
                   properties, scene_splats)
    return (live, preferences, properties, operators, io_formats, colmap_import, panels, engine, scene_splats, overlay,
            composite)


def register():
    for module in _modules():
        module.register()


def unregister():
    for module in reversed(_modules()):
        module.unregister()
