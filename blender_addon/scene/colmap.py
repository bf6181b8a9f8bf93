"""COLMAP models in the scene. A model (read by core/colmap.py, as the backend reads it to train) comes into the
scene as one camera object per registered photo (its intrinsics as lens, sensor and shift, the photo as its
background image), and its 3D points as a point cloud (a mesh of vertices with a colour attribute), all children
of one Empty, "COLMAP <folder>", whose transform takes COLMAP's world to Blender's (up axis, scale, centre). The
photos of the training images go to the backend with their cameras as they are in the scene, and the point cloud
as initial points (ops/colmap.py): they train as captured views do, and the model lines up with the imported
cameras wherever the Empty is moved."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import bpy
import numpy as np
from mathutils import Matrix

from ..core import colmap
from ..core.cameras import BLENDER_TO_OPENCV, Camera, blender_lens, from_blender_c2w
from ..core.errors import SplatwrightError
from ..logic.colors import linear_to_srgb8, srgb_to_linear

EMPTY_PREFIX = "COLMAP "
MODEL_KEY = "splatwright_colmap"  # on the Empty: the model folder
PHOTOS_KEY = "splatwright_photos"  # on the Empty: the photos' folder
PHOTO_KEY = "splatwright_photo"  # on a camera: its image's name in the model
SPLIT_KEY = "splatwright_split"  # on a camera: "train" or "test", as the backend splits the model's images
POINTS_KEY = "splatwright_points"  # on the point cloud
COLOR_ATTRIBUTE = "Col"
CAMERA_SIZE = 0.03  # cameras are drawn this large, relative to the model's extent


def import_model(context, directory: str, up_axis: str, centre: bool, scale: float) -> tuple[object, str]:
    """The Empty holding the model's cameras and points, made the only selected and the active object, and a line
    on what came in. Refused (nothing made) when the model cannot be read or has a camera model with lens
    distortion (Import COLMAP undistorts such a model first, ops/colmap.py)."""
    root, folder = colmap.capture_folders(directory)
    model = colmap.read_model(folder)
    images = colmap.split_images(model, "all")
    if not images:
        raise SplatwrightError(f"{folder}: the COLMAP model registers no images")
    cameras = [colmap.camera_of(model, image, f"{folder} image {image.name}") for image in images]
    photos = root / colmap.IMAGES_FOLDER
    scene, collection = context.scene, context.collection
    sizes = Counter((cam.width, cam.height) for cam in cameras)
    (width, height), _ = sizes.most_common(1)[0]
    extent = model_extent(cameras, model.xyz)

    name = root.parent.name if root.name == colmap.UNDISTORTED else root.name  # an undistorted copy: its capture's
    empty = bpy.data.objects.new(f"{EMPTY_PREFIX}{name}", None)
    empty.empty_display_type, empty.empty_display_size = "ARROWS", 0.1 * extent
    empty[MODEL_KEY], empty[PHOTOS_KEY] = str(folder), str(photos)
    collection.objects.link(empty)
    empty.matrix_world = Matrix(colmap.placement(cameras, model.xyz, up_axis, centre, scale).tolist())
    found, objects = 0, []
    for index, (image, cam) in enumerate(zip(images, cameras)):
        obj = camera_object(Path(image.name).stem, cam, extent)
        objects.append(obj)
        obj[PHOTO_KEY], obj[SPLIT_KEY] = image.name, colmap.split_of(index)
        obj.parent = empty
        collection.objects.link(obj)
        photo = colmap.image_path(photos, image.name)
        if photo.is_file():
            show_photo(obj.data, photo)
            found += 1
    if len(model.xyz):
        points = point_cloud(f"{name} Points", model.xyz, model.rgb)
        points.parent = empty
        collection.objects.link(points)

    first = next(i for i, cam in enumerate(cameras) if (cam.width, cam.height) == (width, height))
    _, size = blender_lens(cameras[first].K, width, height)
    r = scene.render
    r.resolution_x, r.resolution_y, r.resolution_percentage = size.resolution_x, size.resolution_y, 100
    r.pixel_aspect_x, r.pixel_aspect_y = size.pixel_aspect_x, size.pixel_aspect_y
    if scene.camera is None:
        scene.camera = objects[first]
    for obj in context.view_layer.objects.selected:
        obj.select_set(False)
    empty.select_set(True)
    context.view_layer.objects.active = empty
    summary = (f"imported {len(images)} cameras and {len(model.xyz)} points of {folder} as {empty.name}; the scene "
               f"renders at the photos' {width}x{height}")
    if found < len(images):
        summary += f"; {len(images) - found} photos are not in {photos}"
    if len(sizes) > 1:
        summary += (f"; {len(images) - sizes[(width, height)]} cameras have other sizes, whose frames are right only "
                    "at their own render size")
    return empty, summary


def model_extent(cameras: list[Camera], xyz: np.ndarray) -> float:
    """The size of what the model spans (its cameras and points), in COLMAP's units."""
    spots = np.concatenate([np.array([cam.position for cam in cameras]), np.asarray(xyz, np.float64).reshape(-1, 3)])
    return max(float(np.linalg.norm(spots.max(0) - spots.min(0))), 1e-6)


def camera_object(name: str, cam: Camera, extent: float):
    """A camera object seeing what `cam` sees, placed in COLMAP's coordinates (its parent places those)."""
    lens, _ = blender_lens(cam.K, cam.width, cam.height)
    data = bpy.data.cameras.new(name)
    data.type, data.lens, data.sensor_fit = lens.type, lens.lens, lens.sensor_fit
    data.sensor_width, data.sensor_height = lens.sensor_width, lens.sensor_height
    data.shift_x, data.shift_y = lens.shift_x, lens.shift_y
    data.clip_start, data.clip_end = 1e-4 * extent, 10.0 * extent
    data.display_size = CAMERA_SIZE * extent
    obj = bpy.data.objects.new(name, data)
    obj.matrix_basis = Matrix((cam.c2w @ BLENDER_TO_OPENCV).tolist())
    return obj


def show_photo(data, path: Path) -> None:
    """The photo as the camera's background image, filling its frame."""
    data.show_background_images = True
    background = data.background_images.new()
    background.image = bpy.data.images.load(str(path), check_existing=True)
    background.frame_method, background.alpha = "STRETCH", 1.0


def point_cloud(name: str, xyz: np.ndarray, rgb: np.ndarray):
    """A mesh of the points as vertices, their 8-bit sRGB colours as a colour attribute."""
    mesh = bpy.data.meshes.new(name)
    mesh.vertices.add(len(xyz))
    mesh.vertices.foreach_set("co", np.ascontiguousarray(xyz, np.float32).reshape(-1))
    colors = np.ones((len(xyz), 4), np.float32)
    colors[:, :3] = srgb_to_linear(rgb / 255.0)
    mesh.attributes.new(COLOR_ATTRIBUTE, "FLOAT_COLOR", "POINT").data.foreach_set("color", colors.reshape(-1))
    mesh.update()
    obj = bpy.data.objects.new(name, mesh)
    obj[POINTS_KEY] = True
    return obj


def imported_model(context):
    """The COLMAP Empty of the active object (the Empty itself or one of its children), else the scene's only
    one; None if there is none to choose."""
    obj = context.active_object
    while obj is not None and MODEL_KEY not in obj:
        obj = obj.parent
    if obj is not None:
        return obj
    found = [o for o in context.scene.objects if MODEL_KEY in o]
    return found[0] if len(found) == 1 else None


def photo_counts(empty) -> tuple[int, int]:
    """How many of the import's cameras are training and held-out ones."""
    splits = Counter(o.get(SPLIT_KEY) for o in empty.children if o.type == "CAMERA")
    return splits["train"], splits["test"]


def session_name(empty) -> str:
    """The backend session of a COLMAP import: its folder's name, as a session name may be spelled."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", empty.name[len(EMPTY_PREFIX):]).strip("_.-")
    return f"colmap-{safe or 'photos'}"[:64].rstrip(".")


def training_photos(empty, max_side: int) -> list[tuple[str, Camera, np.ndarray, None]]:
    """(name, camera, RGBA8 pixels with rows bottom-up, no time) of the import's training photos in name order: the
    camera as the scene has it now, its intrinsics the model's, fitted to the photo file and scaled so that
    its longer side is at most `max_side` pixels (0: full size)."""
    model = colmap.read_model(empty[MODEL_KEY])
    by_name = {image.name: image for image in model.images.values()}
    cameras = sorted((o for o in empty.children if o.type == "CAMERA" and o.get(SPLIT_KEY) == "train"),
                     key=lambda o: o[PHOTO_KEY])
    photos = []
    for obj in cameras:
        name, path = obj[PHOTO_KEY], colmap.image_path(empty[PHOTOS_KEY], obj[PHOTO_KEY])
        if name not in by_name:
            raise SplatwrightError(f"{obj.name}: its photo {name} is not in the model {empty[MODEL_KEY]} any more; "
                                   "import the model again")
        if not path.is_file():
            raise SplatwrightError(f"{path}: the photo of camera {obj.name} is missing; put it back or import the "
                                   "model again")
        image = bpy.data.images.load(str(path), check_existing=False)  # a copy: scaling it leaves the shown one
        try:
            width, height = image.size
            if width < 1 or height < 1:
                raise SplatwrightError(f"{path}: Blender cannot read this photo")
            declared = colmap.camera_of(model, by_name[name], f"{empty[MODEL_KEY]} image {name}")
            K = declared.K.copy()
            K[0] *= width / declared.width
            K[1] *= height / declared.height
            location, rotation, _ = obj.matrix_world.decompose()  # the Empty's scale does not change what it sees
            cam = from_blender_c2w(np.array(Matrix.LocRotScale(location, rotation, None)), K, width, height, obj.name)
            if max_side and max(width, height) > max_side:
                cam = cam.scaled(max_side / max(width, height))
                image.scale(cam.width, cam.height)
            pixels = np.empty(cam.width * cam.height * 4, np.float32)
            image.pixels.foreach_get(pixels)  # a byte image's values as stored (sRGB), rows bottom-up
        finally:
            bpy.data.images.remove(image)
        rgba = (pixels * 255.0 + 0.5).astype(np.uint8).reshape(cam.height, cam.width, 4)
        photos.append((Path(name).stem, cam, rgba, None))
    return photos


def world_points(empty) -> tuple[np.ndarray, np.ndarray] | None:
    """The positions (in the world) and 8-bit colours of the import's point cloud, as it is now; None without one."""
    cloud = next((o for o in empty.children if POINTS_KEY in o and o.type == "MESH"), None)
    if cloud is None or not len(cloud.data.vertices):
        return None
    mesh = cloud.data
    co = np.empty(len(mesh.vertices) * 3, np.float32)
    mesh.vertices.foreach_get("co", co)
    m = np.array(cloud.matrix_world)
    xyz = co.reshape(-1, 3) @ m[:3, :3].T + m[:3, 3]
    rgb = np.full((len(xyz), 3), 128, np.uint8)
    colors = mesh.attributes.get(COLOR_ATTRIBUTE)
    if colors is not None and colors.domain == "POINT":
        linear = np.empty(len(xyz) * 4, np.float32)
        colors.data.foreach_get("color", linear)
        rgb = linear_to_srgb8(linear.reshape(-1, 4)[:, :3])
    return xyz.astype(np.float32), rgb
