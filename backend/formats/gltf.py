"""glTF 2.0 with Khronos's KHR_gaussian_splatting, binary (.glb) or JSON (.gltf):
https://github.com/KhronosGroup/glTF/tree/main/extensions/2.0/Khronos/KHR_gaussian_splatting

A splat model is a mesh primitive of mode POINTS (0) carrying the extension object (kernel "ellipse", colorSpace
"srgb_rec709_display": 3DGS's display-referred colours, blended as they are) and the attributes POSITION (VEC3),
KHR_gaussian_splatting:ROTATION (VEC4, the unit quaternion x, y, z, w), :SCALE (VEC3, linear, exp of the log
scale), :OPACITY (SCALAR, after the sigmoid, in [0, 1]) and :SH_DEGREE_l_COEF_n (VEC3 RGB, n = 0 .. 2l, l = 0 .. 3,
every degree up to the highest whole). Accessors may be float or, where the extension allows, normalised
integers (read as glTF defines them). Nothing is quantised in what we write (float32 throughout, and COLOR_0, the
diffuse colour made linear, with the opacity as alpha, for viewers without splats), so a write then a read gives
back the model but for the opacity: stored after the sigmoid, a logit beyond about +-16 comes back as +-16 (the
opacity differs by under 1e-7).

Axes: glTF's are left, up, front (LUF: +Y up, the asset's front facing +Z), as splat-transform and Niantic's SPZ
library take them; the official 3DGS PLY and our model are RDF. The two differ by a half turn about z: (x, y, z)
-> (-x, -y, z), quaternions turned with it and the SH coefficients by the turn (placement.placed). A read applies
each splat primitive's node transforms (its world matrix in the default scene) before that turn.

KHR_gaussian_splatting_compression_spz_2 (a draft; also read under its earlier name without "_2",
https://github.com/KhronosGroup/glTF/tree/main/extensions/2.0/Khronos/KHR_gaussian_splatting_compression_spz_2)
keeps a primitive's splats as an SPZ file in a bufferView, packed from LUF: formats.spz reads it (by the SPZ
specification's RUB axes, into ours) against the same budget.
"""
from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import replace

import numpy as np
import torch

from blender_addon.core.errors import SplatwrightError
from ..gaussians import Gaussians
from ..placement import placed
from ..sh import SH_C0
from . import spz
from .budget import Budget
from .common import columns, gaussians_from_columns, sh_degree_of, sigmoid
from .validate import validated

EXTENSION = "KHR_gaussian_splatting"
SPZ_EXTENSIONS = ("KHR_gaussian_splatting_compression_spz_2", "KHR_gaussian_splatting_compression_spz")
GLB_MAGIC = b"glTF"
GLB_HEADER = struct.Struct("<4sII")  # magic, version, length
CHUNK_HEADER = struct.Struct("<II")  # length, type
JSON_CHUNK, BIN_CHUNK = 0x4E4F534A, 0x004E4942
POINTS = 0
ARRAY_BUFFER = 34962
FLOAT, UNSIGNED_BYTE = 5126, 5121
COMPONENTS = {5120: np.dtype("i1"), 5121: np.dtype("u1"), 5122: np.dtype("<i2"), 5123: np.dtype("<u2"),
              5125: np.dtype("<u4"), 5126: np.dtype("<f4")}
NORMALISED = {5120: 127.0, 5121: 255.0, 5122: 32767.0, 5123: 65535.0}  # glTF's divisors of normalised integers
WIDTHS = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
COLOR_SPACE = "srgb_rec709_display"
TO_GLTF = np.diag([-1.0, -1.0, 1.0, 1.0])  # our axes (RDF) to glTF's (LUF), and back: a half turn about z
OPACITY_MARGIN = 1e-7  # a stored opacity of 0 or 1 reads as this far inside (0, 1), so its logit is finite
MAX_NODE_DEPTH = 64
MAX_TRANSFORM = 1e15  # the largest entry of a node's matrix (beyond, composing them overflows)


def attribute(name: str) -> str:
    return f"{EXTENSION}:{name}"


def sh_attribute(degree: int, coefficient: int) -> str:
    return attribute(f"SH_DEGREE_{degree}_COEF_{coefficient}")


def is_glb(head: bytes) -> bool:
    return head[:4] == GLB_MAGIC


def decode(data: bytes, name: str = "the glTF", budget: Budget = Budget()) -> Gaussians:
    """The model of a .glb's or a self-contained .gltf's bytes (a .gltf's buffers beside it are made inline first:
    core/bundles.py): every KHR_gaussian_splatting primitive of its default scene, placed by its node's world
    matrix, in our axes; accessors are checked against the buffers' bytes and `budget` before any is read."""
    gltf, binary = _parse(data, name)
    buffers = _Buffers(gltf, binary, name)
    found = _splat_primitives(gltf, name)
    if not found:
        raise SplatwrightError(f"{name}: no mesh primitive of its scene has the {EXTENSION} extension (a glTF "
                               "without Gaussian splats)")
    models = []
    for primitive, matrix in found:
        g = _primitive_model(gltf, primitive, buffers, name, budget)
        budget.check_count(sum(map(len, models)) + len(g), name)
        try:
            models.append(placed(g, TO_GLTF @ matrix))
        except (ValueError, SplatwrightError) as e:
            raise SplatwrightError(f"{name}: a splat node's transform cannot place splats ({e})") from None
    rest = max(m.sh_rest.shape[1] for m in models)  # primitives of lower SH degrees: their higher bands are zero
    models = [replace(m, sh_rest=torch.cat([m.sh_rest, m.sh_rest.new_zeros(len(m), rest - m.sh_rest.shape[1], 3)],
                                           dim=1)) for m in models]
    return validated(Gaussians(**{k: torch.cat([getattr(m, k) for m in models]).contiguous()
                                  for k in Gaussians.names()}), name, budget)


def encode_glb(g: Gaussians) -> bytes:
    """The .glb of `g`: one node, one POINTS primitive, float attributes."""
    gltf, binary = _document(g)
    gltf["buffers"] = [{"byteLength": len(binary)}]
    text = json.dumps(gltf, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 4)
    binary += b"\0" * (-len(binary) % 4)
    length = GLB_HEADER.size + 2 * CHUNK_HEADER.size + len(text) + len(binary)
    return (GLB_HEADER.pack(GLB_MAGIC, 2, length) + CHUNK_HEADER.pack(len(text), JSON_CHUNK) + text
            + CHUNK_HEADER.pack(len(binary), BIN_CHUNK) + binary)


def encode_gltf(g: Gaussians) -> bytes:
    """The .gltf of `g`, its buffer inline (a data: URI), so the one file is the model."""
    gltf, binary = _document(g)
    gltf["buffers"] = [{"byteLength": len(binary),
                        "uri": "data:application/octet-stream;base64," + base64.b64encode(binary).decode()}]
    return json.dumps(gltf, separators=(",", ":")).encode()


# --- writing ----------------------------------------------------------------------------------------------

def _document(g: Gaussians) -> tuple[dict, bytes]:
    c = columns(placed(g.detached(), TO_GLTF))
    n = len(c["means"])
    if n == 0:
        raise SplatwrightError("glTF: no splats to write")
    opacity = sigmoid(c["opacity_logits"])
    diffuse = np.clip(0.5 + SH_C0 * c["sh_dc"].astype(np.float64), 0.0, 1.0)
    linear = np.where(diffuse <= 0.04045, diffuse / 12.92, ((diffuse + 0.055) / 1.055) ** 2.4)  # COLOR_0 is linear
    arrays = {
        "POSITION": c["means"],
        "COLOR_0": np.round(np.concatenate([linear, opacity[:, None]], axis=1) * 255.0).astype(np.uint8),
        attribute("ROTATION"): c["quats"][:, [1, 2, 3, 0]],
        attribute("SCALE"): np.exp(c["log_scales"].astype(np.float64)),
        attribute("OPACITY"): opacity,
        sh_attribute(0, 0): c["sh_dc"],
    }
    for degree in range(1, sh_degree_of(c["sh_rest"]) + 1):
        for k in range(2 * degree + 1):
            arrays[sh_attribute(degree, k)] = c["sh_rest"][:, degree * degree - 1 + k]
    views, accessors, attributes, chunks, offset = [], [], {}, [], 0
    for semantic, values in arrays.items():
        values = values.reshape(n, -1)
        raw = np.ascontiguousarray(values if values.dtype == np.uint8 else values.astype("<f4")).tobytes()
        accessor = {"bufferView": len(views), "componentType": UNSIGNED_BYTE if values.dtype == np.uint8 else FLOAT,
                    "count": n, "type": "SCALAR" if values.shape[1] == 1 else f"VEC{values.shape[1]}"}
        if semantic == "COLOR_0":
            accessor["normalized"] = True
        if semantic == "POSITION":  # glTF requires its bounds
            accessor["min"], accessor["max"] = values.min(axis=0).tolist(), values.max(axis=0).tolist()
        views.append({"buffer": 0, "byteOffset": offset, "byteLength": len(raw), "target": ARRAY_BUFFER})
        attributes[semantic] = len(accessors)
        accessors.append(accessor)
        chunks.append(raw + b"\0" * (-len(raw) % 4))
        offset += len(chunks[-1])
    extension = {"kernel": "ellipse", "colorSpace": COLOR_SPACE, "projection": "perspective",
                 "sortingMethod": "cameraDistance"}
    gltf = {"asset": {"version": "2.0", "generator": "Splatwright"}, "extensionsUsed": [EXTENSION],
            "scene": 0, "scenes": [{"nodes": [0]}], "nodes": [{"mesh": 0}],
            "meshes": [{"primitives": [{"attributes": attributes, "mode": POINTS,
                                        "extensions": {EXTENSION: extension}}]}],
            "bufferViews": views, "accessors": accessors}
    return gltf, b"".join(chunks)


# --- reading ----------------------------------------------------------------------------------------------

def _parse(data: bytes, name: str) -> tuple[dict, memoryview | None]:
    """The glTF's JSON and a .glb's binary chunk."""
    binary = None
    if is_glb(data):
        if len(data) < GLB_HEADER.size + CHUNK_HEADER.size:
            raise SplatwrightError(f"{name}: truncated .glb ({len(data)} bytes)")
        _, version, length = GLB_HEADER.unpack_from(data)
        if version != 2:
            raise SplatwrightError(f"{name}: a .glb of version {version}; glTF 2.0 is read")
        if length > len(data):
            raise SplatwrightError(f"{name}: truncated .glb: its header says {length:,} bytes, the file holds "
                                   f"{len(data):,}")
        chunks, offset = [], GLB_HEADER.size
        while offset + CHUNK_HEADER.size <= length:
            size, kind = CHUNK_HEADER.unpack_from(data, offset)
            if offset + CHUNK_HEADER.size + size > length:
                raise SplatwrightError(f"{name}: a .glb chunk runs past the file's end")
            chunks.append((kind, memoryview(data)[offset + CHUNK_HEADER.size:offset + CHUNK_HEADER.size + size]))
            offset += CHUNK_HEADER.size + size
        if not chunks or chunks[0][0] != JSON_CHUNK:
            raise SplatwrightError(f"{name}: a .glb whose first chunk is not its JSON")
        text = bytes(chunks[0][1])
        binary = chunks[1][1] if len(chunks) > 1 and chunks[1][0] == BIN_CHUNK else None
    else:
        text = data
    try:
        gltf = json.loads(bytes(text).decode("utf-8-sig"))
    except (ValueError, RecursionError) as e:
        raise SplatwrightError(f"{name}: not a glTF (its JSON does not parse: {e})") from None
    if not isinstance(gltf, dict) or not isinstance(gltf.get("asset"), dict):
        raise SplatwrightError(f"{name}: not a glTF (no `asset` in its JSON)")
    version = str(gltf["asset"].get("version", ""))
    if not version.startswith("2."):
        raise SplatwrightError(f"{name}: glTF version {version!r}; glTF 2.0 is read")
    return gltf, binary


def _entry(gltf: dict, kind: str, index, name: str) -> dict:
    """`gltf[kind][index]`, checked."""
    table = gltf.get(kind)
    if not isinstance(index, int) or isinstance(index, bool) or not isinstance(table, list) \
            or not 0 <= index < len(table) or not isinstance(table[index], dict):
        raise SplatwrightError(f"{name}: refers to {kind} {index!r}, which it does not have")
    return table[index]


class _Buffers:
    """The glTF's buffers' bytes, decoded when first used: a .glb's binary chunk or a data: URI."""

    def __init__(self, gltf: dict, binary: memoryview | None, name: str):
        self.gltf, self.binary, self.name, self.found = gltf, binary, name, {}

    def view(self, index) -> memoryview:
        """The bytes of bufferView `index`."""
        view = _entry(self.gltf, "bufferViews", index, self.name)
        data = self.buffer(view.get("buffer"))
        start, length = _whole(view.get("byteOffset", 0)), _whole(view.get("byteLength"))
        if start is None or length is None or start + length > len(data):
            raise SplatwrightError(f"{self.name}: bufferView {index} ({view.get('byteOffset', 0)!r} + "
                                   f"{view.get('byteLength')!r} bytes) runs past its buffer's {len(data):,} bytes")
        return data[start:start + length]

    def buffer(self, index) -> memoryview:
        buffer = _entry(self.gltf, "buffers", index, self.name)
        if index not in self.found:
            uri = buffer.get("uri")
            if uri is None:
                if index != 0 or self.binary is None:
                    raise SplatwrightError(f"{self.name}: buffer {index} has no data (no URI, and no .glb binary "
                                           "chunk)")
                data = self.binary
            elif isinstance(uri, str) and uri.startswith("data:"):
                header, _, payload = uri.partition(",")
                if not header.endswith(";base64"):
                    raise SplatwrightError(f"{self.name}: buffer {index}'s data: URI is not base64")
                try:
                    data = memoryview(base64.b64decode(payload, validate=True))
                except (binascii.Error, ValueError) as e:
                    raise SplatwrightError(f"{self.name}: buffer {index}'s data: URI is not base64 ({e})") from None
            else:
                raise SplatwrightError(f"{self.name}: buffer {index} is the separate file {uri!r}; read the .gltf "
                                       "from its folder (its buffers are then read beside it), or use a .glb")
            length = _whole(buffer.get("byteLength"))
            if length is None or length > len(data):
                raise SplatwrightError(f"{self.name}: buffer {index} declares {buffer.get('byteLength')!r} bytes, "
                                       f"its data holds {len(data):,}")
            self.found[index] = data[:length]
        return self.found[index]


def _object(value, what: str, name: str) -> dict:
    """`value` if it is a JSON object, {} if absent; else refused."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SplatwrightError(f"{name}: {what} is not a JSON object")
    return value


def _array(value, what: str, name: str) -> list:
    """`value` if it is a JSON array, [] if absent; else refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise SplatwrightError(f"{name}: {what} is not a JSON array")
    return value


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _splat_primitives(gltf: dict, name: str) -> list[tuple[dict, np.ndarray]]:
    """Every KHR_gaussian_splatting primitive of the default scene (the first, where none is named; every mesh,
    untransformed, where there is no scene) and its node's world matrix."""
    found = []

    def visit(index, parent: np.ndarray, depth: int) -> None:
        if depth > MAX_NODE_DEPTH:
            raise SplatwrightError(f"{name}: its nodes nest deeper than {MAX_NODE_DEPTH} (or in a cycle)")
        node = _entry(gltf, "nodes", index, name)
        matrix = parent @ _local_matrix(node, index, name)
        if "mesh" in node:
            found.extend((primitive, matrix) for primitive in splats_of(_entry(gltf, "meshes", node["mesh"], name)))
        for child in _array(node.get("children"), f"node {index}'s children", name):
            visit(child, matrix, depth + 1)

    def splats_of(mesh: dict) -> list[dict]:
        primitives = [_object(p, "a mesh primitive", name) for p in _array(mesh.get("primitives"), "a mesh's "
                                                                            "primitives", name)]
        return [p for p in primitives if EXTENSION in _object(p.get("extensions"), "a primitive's extensions", name)]

    if _array(gltf.get("scenes"), "scenes", name):
        for root in _array(_entry(gltf, "scenes", gltf.get("scene", 0), name).get("nodes"), "a scene's nodes", name):
            visit(root, np.eye(4), 0)
    else:
        for mesh in _array(gltf.get("meshes"), "meshes", name):
            found.extend((primitive, np.eye(4)) for primitive in splats_of(_object(mesh, "a mesh", name)))
    return found


def _local_matrix(node: dict, index: int, name: str) -> np.ndarray:
    """A node's local transform: its matrix (column-major) or translation, rotation (x, y, z, w) and scale."""
    try:
        if "matrix" in node:
            m = np.array(node["matrix"], np.float64).reshape(4, 4).T
        else:
            x, y, z, w = np.array(node.get("rotation", [0, 0, 0, 1]), np.float64).reshape(4)
            rotation = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                                 [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                                 [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
            m = np.eye(4)
            m[:3, :3] = rotation * np.array(node.get("scale", [1, 1, 1]), np.float64).reshape(3)
            m[:3, 3] = np.array(node.get("translation", [0, 0, 0]), np.float64).reshape(3)
    except (TypeError, ValueError):
        raise SplatwrightError(f"{name}: node {index}'s transform is not numbers of the right count") from None
    if not np.all(np.abs(m) < MAX_TRANSFORM):
        raise SplatwrightError(f"{name}: node {index}'s transform is not finite, or beyond {MAX_TRANSFORM:g}")
    return m


def _primitive_model(gltf: dict, primitive: dict, buffers: _Buffers, name: str, budget: Budget) -> Gaussians:
    """One splat primitive's model in glTF's axes, before its node's transform."""
    extension = _object(primitive["extensions"][EXTENSION], f"its {EXTENSION} extension", name)
    if primitive.get("mode") != POINTS:
        raise SplatwrightError(f"{name}: a splat primitive of mode {primitive.get('mode', 4)!r}; "
                               f"{EXTENSION} primitives are POINTS (mode 0)")
    for key, expected in (("kernel", "ellipse"), ("colorSpace", COLOR_SPACE), ("projection", "perspective")):
        if extension.get(key, expected) != expected:
            raise SplatwrightError(f"{name}: splats of {key} {extension[key]!r}; Splatwright draws {key} "
                                   f"{expected!r} (3DGS's) only")
    attributes = _object(primitive.get("attributes"), "a splat primitive's attributes", name)
    inner = _object(extension.get("extensions"), f"its {EXTENSION} extension's extensions", name)
    compressed = [e for e in SPZ_EXTENSIONS if e in inner]
    if compressed:
        view = _object(inner[compressed[0]], compressed[0], name).get("bufferView")
        g = spz.decode(bytes(buffers.view(view)), f"{name} (its SPZ bufferView {view!r})", budget, "rub")
        if "POSITION" in attributes:
            count = _entry(gltf, "accessors", attributes["POSITION"], name).get("count")
            if count != len(g):
                raise SplatwrightError(f"{name}: its accessors count {count!r} splats, its SPZ holds {len(g)}")
        return placed(g, TO_GLTF)  # SPZ read into our axes; the glTF's are LUF

    def read(semantic: str, width: int) -> np.ndarray:
        if semantic not in attributes:
            raise SplatwrightError(f"{name}: a splat primitive without {semantic}")
        values = _accessor(gltf, attributes[semantic], width, semantic, buffers, name, budget)
        if semantic != "POSITION" and len(values) != n:
            raise SplatwrightError(f"{name}: {semantic} has {len(values):,} elements, POSITION {n:,}; a splat "
                                   "primitive's attributes have one per splat")
        return values

    means = read("POSITION", 3)
    n = len(means)
    scales = read(attribute("SCALE"), 3)
    opacity = read(attribute("OPACITY"), 1)[:, 0]
    if (scales < 0).any():
        raise SplatwrightError(f"{name}: {int((scales < 0).any(axis=1).sum())} of {n} splats have negative scales")
    if ((opacity < 0) | (opacity > 1)).any():
        raise SplatwrightError(f"{name}: {int(((opacity < 0) | (opacity > 1)).sum())} of {n} splats have opacities "
                               "outside [0, 1]")
    degree = 0
    while degree < 3 and sh_attribute(degree + 1, 0) in attributes:
        degree += 1
    rest = [read(sh_attribute(d, k), 3) for d in range(1, degree + 1) for k in range(2 * d + 1)]
    p = np.clip(opacity.astype(np.float64), OPACITY_MARGIN, 1.0 - OPACITY_MARGIN)
    quats = read(attribute("ROTATION"), 4)[:, [3, 0, 1, 2]].astype(np.float64)
    with np.errstate(all="ignore"):  # in float64, so large values normalise; what is not finite the validator refuses
        quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    return gaussians_from_columns({
        "means": means,
        "quats": quats.astype(np.float32),
        "log_scales": np.log(np.maximum(scales, np.finfo(np.float32).tiny)).astype(np.float32),
        "opacity_logits": np.log(p / (1.0 - p)).astype(np.float32),
        "sh_dc": read(sh_attribute(0, 0), 3),
        "sh_rest": np.stack(rest, axis=1) if rest else np.zeros((n, 0, 3), np.float32),
    }, name, budget)


def _accessor(gltf: dict, index, width: int, semantic: str, buffers: _Buffers, name: str,
              budget: Budget) -> np.ndarray:
    """Accessor `index` as float32 (count, width), its bytes checked to lie within its bufferView first."""
    accessor = _entry(gltf, "accessors", index, name)
    what = f"{semantic} (accessor {index})"
    kind, component_type = accessor.get("type"), accessor.get("componentType")
    if not isinstance(kind, str) or WIDTHS.get(kind) != width:
        raise SplatwrightError(f"{name}: {what} is of type {kind!r}, not {'SCALAR' if width == 1 else f'VEC{width}'}")
    component = COMPONENTS.get(component_type) if isinstance(component_type, int) else None
    if component is None:
        raise SplatwrightError(f"{name}: {what} has componentType {accessor.get('componentType')!r}")
    count = _whole(accessor.get("count"))
    if not count:
        raise SplatwrightError(f"{name}: {what} counts {accessor.get('count')!r} splats")
    budget.check_count(count, name)
    if "sparse" in accessor or "bufferView" not in accessor:
        raise SplatwrightError(f"{name}: {what} is sparse or has no bufferView; Splatwright reads accessors "
                               "stored whole")
    view = buffers.view(accessor["bufferView"])
    element = component.itemsize * width
    stride = _entry(gltf, "bufferViews", accessor["bufferView"], name).get("byteStride") or element
    start = _whole(accessor.get("byteOffset", 0))
    if start is None or not isinstance(stride, int) or stride < element \
            or start + stride * (count - 1) + element > len(view):
        raise SplatwrightError(f"{name}: {what}'s {count:,} elements run past its bufferView's {len(view):,} bytes")
    rows = np.lib.stride_tricks.as_strided(np.frombuffer(view, np.uint8, offset=start), (count, element),
                                           (stride, 1))
    values = np.ascontiguousarray(rows).view(component).reshape(count, width).astype(np.float32)
    divisor = NORMALISED.get(accessor["componentType"]) if accessor.get("normalized") else None
    if divisor is not None:
        values = np.maximum(values / np.float32(divisor), -1.0)
    return values
