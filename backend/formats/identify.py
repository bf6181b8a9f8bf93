"""What a file that no splat reader takes looks like, from its first bytes, for the refusal to name it. A zip, a
.glb and JSON never come here: formats.detect takes them for a SOG or a glTF, whose readers say what is wrong."""
from __future__ import annotations

# (the bytes a file starts with, at what offset, what it is); the first that matches names it.
SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", 0, "a PNG image"),
    (b"\xff\xd8\xff", 0, "a JPEG image"),
    (b"WEBP", 8, "a WebP image (one of a SOG folder's: open its meta.json)"),
    (b"GIF8", 0, "a GIF image"),
    (b"%PDF", 0, "a PDF document"),
    (b"\x28\xb5\x2f\xfd", 0, "a zstd stream"),
    (b"BZh", 0, "a bzip2 stream"),
    (b"\xfd7zXZ\x00", 0, "an xz stream"),
    (b"7z\xbc\xaf\x27\x1c", 0, "a 7-Zip archive"),
    (b"BLENDER", 0, "a .blend file"),
)


def looks_like(head: bytes) -> str | None:
    """What `head`, a file's first bytes, looks like, in a few words; None for a binary file of no kind known
    here (a .splat, which has no magic, is one)."""
    for magic, offset, what in SIGNATURES:
        if head[offset:offset + len(magic)] == magic:
            return what
    if not head:
        return "an empty file"
    if all(32 <= b < 127 or b in b"\t\r\n" for b in head[:4096]):
        return "a text file"
    return None
