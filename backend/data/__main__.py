"""`python -m backend.data CAPTURE`: a COLMAP capture's undistorted copy made where its cameras have lens
distortion and it has none as new as the model (colmap.undistorted), and the capture folder to read printed last;
the add-on runs it with the backend's Python where Blender's has no pycolmap, its zip holding no tools. An error
is one `error:` line and exit status 1."""
import argparse
import sys

from blender_addon.core.colmap import capture_folders
from blender_addon.core.errors import SplatwrightError
from . import colmap

parser = argparse.ArgumentParser(prog="python -m backend.data", description=__doc__.splitlines()[0])
parser.add_argument("capture", help="a COLMAP capture folder (images/ beside sparse/0/ or sparse/)")
try:
    folder, note = colmap.undistorted(capture_folders(parser.parse_args().capture)[0])
    if note:
        print(f"note: {note}")
    print(folder)
except SplatwrightError as e:
    print(f"error: {e}")
    sys.exit(1)
except Exception as e:  # COLMAP's own failures: one line too, for the add-on's report
    print(f"error: undistorting the capture failed: {type(e).__name__}: {e}")
    sys.exit(1)
