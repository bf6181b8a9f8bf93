"""`python -m backend.data CAPTURE`: make what a scene folder needs before it loads (prepare: a distorted COLMAP
model's undistorted copy) and print the folder to read last; the add-on runs it with the backend's Python where
Blender's has no pycolmap, its zip holding no tools. An error is one `error:` line and exit status 1."""
import argparse
import sys

from blender_addon.core.errors import SplatwrightError
from . import colmap, prepare

parser = argparse.ArgumentParser(prog="python -m backend.data", description=__doc__.splitlines()[0])
parser.add_argument("capture", help="a COLMAP capture folder (images/ beside sparse/0/ or sparse/)")
capture = parser.parse_args().capture
try:
    note = prepare(capture)
    if note:
        print(f"note: {note}")
    print(colmap.undistorted(capture)[0])
except SplatwrightError as e:
    print(f"error: {e}")
    sys.exit(1)
