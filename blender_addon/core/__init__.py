"""What the add-on and the backend share: camera conventions, errors, atomic files, point clouds, the wire
protocol and its client. Standard library + numpy only (Blender's Python has no torch); the backend imports
this package as `blender_addon.core`, the add-on as `.core`."""
