"""Reading cameras, bounds and surface points out of Blender data into the bpy-free types."""
from __future__ import annotations

import bpy
import numpy as np

from ..core.cameras import BlenderLens, Camera, RenderSize, from_blender_camera, from_blender_view
from ..core.errors import SplatwrightError
from ..logic.colors import linear_to_srgb8
from ..logic.dataset import capture_percentage, sample_surface

GEOMETRY = {"MESH", "CURVE", "SURFACE", "META", "FONT", "VOLUME", "POINTCLOUD", "CURVES"}
NO_MATERIAL = (0.8, 0.8, 0.8)  # Blender's default surface colour


def lens_of(data) -> BlenderLens:
    return BlenderLens(data.type, data.lens, data.sensor_width, data.sensor_height, data.sensor_fit,
                       data.shift_x, data.shift_y)


def render_size(render) -> RenderSize:
    return RenderSize(render.resolution_x, render.resolution_y, render.resolution_percentage,
                      render.pixel_aspect_x, render.pixel_aspect_y)


def capture_size(scene) -> tuple[int, int]:
    """The width and height of the views a capture renders (its scale and longest side applied)."""
    s, r = scene.splatwright, scene.render
    percentage = capture_percentage(r.resolution_x, r.resolution_y, s.resolution_percentage, s.max_side)
    return RenderSize(r.resolution_x, r.resolution_y, percentage).pixels


def capture_cameras(scene) -> list:
    """The camera objects a Scene Cameras capture renders through, by name."""
    only_selected = scene.splatwright.only_selected
    return sorted((o for o in scene.objects if o.type == "CAMERA" and (o.select_get() or not only_selected)),
                  key=lambda o: o.name)


def animation_frames(scene) -> range:
    return range(scene.frame_start, scene.frame_end + 1, scene.splatwright.frame_step)


def camera_of(obj, scene) -> Camera:
    """What the scene renders through camera object `obj` now."""
    if obj.type != "CAMERA":
        raise SplatwrightError(f"{obj.name} is not a camera")
    return from_blender_camera(np.array(obj.matrix_world), lens_of(obj.data), render_size(scene.render), obj.name)


def viewport_camera(context) -> Camera | None:
    """The camera of the context's 3D viewport (or the first one on screen); None when there is none."""
    areas = [context.area] if context.area and context.area.type == "VIEW_3D" else []
    if context.screen:
        areas += [a for a in context.screen.areas if a.type == "VIEW_3D"]
    for area in areas:
        region = next((r for r in area.regions if r.type == "WINDOW"), None)
        rv3d = area.spaces.active.region_3d
        if region is not None and rv3d is not None:
            return region_camera(region, rv3d)
    return None


def region_camera(region, rv3d) -> Camera:
    """The camera of a 3D viewport's window region."""
    return from_blender_view(np.array(rv3d.view_matrix), np.array(rv3d.window_matrix), region.width, region.height)


def visible_geometry(scene, view_layer) -> list:
    return [o for o in scene.objects if o.type in GEOMETRY and o.visible_get(view_layer=view_layer)
            and not o.hide_render]


def bounds(objects) -> tuple[np.ndarray, float]:
    """Centre and radius of the sphere around the objects' world bounding boxes."""
    corners = []
    for obj in objects:
        m = np.array(obj.matrix_world)
        corners.append(np.array(obj.bound_box) @ m[:3, :3].T + m[:3, 3])
    if not corners:
        raise SplatwrightError("nothing to look at: no visible geometry in the scene or selection")
    pts = np.concatenate(corners)
    lo, hi = pts.min(0), pts.max(0)
    return 0.5 * (lo + hi), max(0.5 * float(np.linalg.norm(hi - lo)), 1e-3)


def surface_points(context, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Points spread over the visible meshes' evaluated surfaces, coloured by their materials' base colour."""
    depsgraph = context.evaluated_depsgraph_get()
    triangles, colors = [], []
    for obj in visible_geometry(context.scene, context.view_layer):
        if obj.type != "MESH":
            continue
        evaluated = obj.evaluated_get(depsgraph)
        mesh = evaluated.to_mesh()
        try:
            mesh.calc_loop_triangles()
            co = np.empty(len(mesh.vertices) * 3, np.float32)
            mesh.vertices.foreach_get("co", co)
            m = np.array(evaluated.matrix_world)
            co = co.reshape(-1, 3) @ m[:3, :3].T + m[:3, 3]
            n = len(mesh.loop_triangles)
            corners = np.empty(n * 3, np.int32)
            mesh.loop_triangles.foreach_get("vertices", corners)
            slots = np.empty(n, np.int32)
            mesh.loop_triangles.foreach_get("material_index", slots)
            palette = np.array([base_color(s.material) for s in evaluated.material_slots] or [NO_MATERIAL])
            triangles.append(co[corners.reshape(-1, 3)])
            colors.append(palette[np.clip(slots, 0, len(palette) - 1)])
        finally:
            evaluated.to_mesh_clear()
    if not triangles:
        raise SplatwrightError("no visible meshes to take initial points from; turn off 'Initial Points'")
    return sample_surface(np.concatenate(triangles), linear_to_srgb8(np.concatenate(colors)), count, seed)


def base_color(material) -> tuple[float, float, float]:
    if material is None:
        return NO_MATERIAL
    uses_nodes = bpy.app.version >= (5, 0, 0) or material.use_nodes  # 5.0: always, and use_nodes is deprecated
    if uses_nodes and material.node_tree:
        for node in material.node_tree.nodes:
            if node.type == "BSDF_PRINCIPLED":
                return tuple(node.inputs["Base Color"].default_value[:3])
    return tuple(material.diffuse_color[:3])
