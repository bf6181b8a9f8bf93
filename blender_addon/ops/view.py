"""Render Preview: the model seen from the 3D viewport (or the scene camera), into an image."""
import bpy
import numpy as np
from bpy.types import Operator

from ..core.errors import SplatwrightError
from ..logic.colors import display_pixels
from ..scene import live
from ..scene.reading import camera_of, viewport_camera
from ..scene.session import nothing_to_show
from .base import Guarded


PREVIEW_IMAGE = "Splatwright Preview"


PREVIEW_MAX_SIDE = 512


class NeedsModel(Guarded):
    """An operator on the backend's model: allowed once there is one."""
    @classmethod
    def blocked(cls, context):
        return nothing_to_show()


class SPLATWRIGHT_OT_render_preview(NeedsModel, Operator):
    """Render the model from the 3D viewport (or the scene camera) into the image 'Splatwright Preview'"""
    bl_idname = "splatwright.render_preview"
    bl_label = "Render Preview"

    def execute(self, context):
        scene = context.scene
        try:
            cam = viewport_camera(context) or (camera_of(scene.camera, scene) if scene.camera else None)
        except SplatwrightError as e:
            self.report({"ERROR"}, str(e))
            return {"CANCELLED"}
        if cam is None:
            self.report({"ERROR"}, "no 3D viewport or scene camera to render from")
            return {"CANCELLED"}
        cam = cam.scaled(min(1.0, PREVIEW_MAX_SIDE / max(cam.width, cam.height)))
        live.backend.call("render", lambda c: c.render(cam), show_preview)
        return {"FINISHED"}


def show_preview(rgba: np.ndarray) -> str:
    """Put a bottom-up RGBA8 frame into the preview image (bottom-up too, as Blender stores pixels)."""
    h, w = rgba.shape[:2]
    image = bpy.data.images.get(PREVIEW_IMAGE) or bpy.data.images.new(PREVIEW_IMAGE, w, h, alpha=True)
    if tuple(image.size) != (w, h):
        image.scale(w, h)
    image.pixels.foreach_set(display_pixels(rgba))  # a byte image holds the sRGB-encoded values
    image.update()
    return ""



CLASSES = (SPLATWRIGHT_OT_render_preview,)
register, unregister = bpy.utils.register_classes_factory(CLASSES)
