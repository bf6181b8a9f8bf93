"""The add-on in Blender's data: its live state and the open session, its preferences' place, capture, reading
the scene, splat objects and COLMAP imports. Imports logic/ and core/."""
