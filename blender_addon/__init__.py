"""Splatwright: capture the scene's cameras and renders, train 3D Gaussian Splats in a backend process and
view them. Installs as a legacy add-on (bl_info, Blender 3.4+) or an extension (blender_manifest.toml, 4.2+).

Its layers, each a folder that imports only those below it: ui/ (panels, settings, preferences) -> ops/
(operators by feature) -> render/ (engine, overlay, composite) -> scene/ (the add-on's state in Blender, capture,
splat objects) -> logic/ (no bpy) -> core/ (shared with the backend: stdlib and numpy only)."""

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
    """The modules that register classes, handlers or timers with Blender, in registration order. Imported
    here, not at the top, so that the package and its bpy-free layers (logic/, core/) import without Blender,
    as the backend and the tests import them."""
    from .ops import backend, capture, colmap, flow, formats, splats, training, view
    from .render import composite, engine, overlay
    from .scene import folders, following, linked, live, native
    from .ui import panels, preferences, properties, statusbar
    return (live, following, linked, native, folders, preferences, properties, backend, capture, training, view, formats,
            colmap, splats, flow, panels, statusbar, engine, overlay, composite)


def register():
    for module in _modules():
        module.register()


def unregister():
    for module in reversed(_modules()):
        module.unregister()
