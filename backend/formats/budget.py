"""What one read of a model file may inflate and allocate, decided from what the file declares before anything is
inflated or allocated; and the streams that inflate compressed data no further than that.

A decoder first reads the counts a file declares (its header) and asks its Budget for the bytes they need decoded:
the splat count times the format's bytes per splat. That is refused where the count is over the model-size limit
(`splats`, MAX_MODEL_SPLATS unless the caller sets another: the server's --max-model-splats), or where the
file's stored bytes cannot plausibly hold it: an uncompressed format must hold every byte it declares, and a
compressed one at most MAX_RATIO times its stored size (real models compress 1.4-12:1, measured on models of
SH degree 0-3 and on untrained ones whose rotations, scales and higher SH are all alike; zeros compress 1000:1
with gzip and beyond with zstd) plus SMALL_FILE_BYTES, which any small file may inflate to. Only then does it
inflate, through Inflater, which stops at the bytes asked for, so a stream that holds more than its header says
is refused having inflated no more than the budget.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from blender_addon.core.errors import SplatwrightError

try:
    import zstandard
except ImportError:  # optional: only SPZ version 4 files need it, and reading one says how to install it
    zstandard = None

MAX_MODEL_SPLATS = 50_000_000  # Gaussians a model read from a file may have (11.8 GB of parameters at SH degree 3)
MAX_RATIO = 64  # the most a compressed model file is taken to inflate, in bytes decoded per byte stored
SMALL_FILE_BYTES = 16 << 20  # bytes any file may inflate to, whatever its ratio
_PIECE = 1 << 16  # compressed bytes handed to the decompressor at a time
_OUT = 1 << 22  # decompressed bytes asked of it at a time


@dataclass(frozen=True)
class Budget:
    """The model-size limit of a read: at most `splats` Gaussians. `advice` says how to allow more (the server
    names its flag)."""
    splats: int = MAX_MODEL_SPLATS
    advice: str = ""

    def check_count(self, count: int, name: str) -> None:
        """Refuse a model of `count` Gaussians over the limit (what an uncompressed format's reader checks, besides
        the bytes its counts need against the file's)."""
        if count > self.splats:
            raise SplatwrightError(f"{name}: {count:,} splats, over the limit of {self.splats:,} for a model read from "
                                   f"a file{'; ' + self.advice if self.advice else ''}")

    def decoded_bytes(self, count: int, bytes_per_splat: int, stored: int, name: str) -> int:
        """The bytes `count` splats of `bytes_per_splat` take inflated from a compressed file of `stored` bytes;
        refused over the limit or beyond what the file can plausibly hold."""
        self.check_count(count, name)
        need = count * bytes_per_splat
        if need > stored * MAX_RATIO + SMALL_FILE_BYTES:
            raise SplatwrightError(f"{name}: {count:,} splats declared in {stored:,} bytes would inflate "
                                   f"{need / stored:,.0f} times; real models inflate far less than {MAX_RATIO} times, "
                                   "so the count is false (a decompression bomb or a corrupt file)")
        return need


def zstd_available() -> bool:
    return zstandard is not None


class Inflater:
    """A compressed stream inflated as far as it is read and no further: `kind` "gzip" (one or more members, as
    gzip.decompress reads them) or "zstd" (one frame). Errors name the file `name` and say `what` the stream is."""

    def __init__(self, data: bytes | memoryview, name: str, what: str, kind: str = "gzip"):
        self.data, self.name, self.what, self.kind = memoryview(data), name, what, kind
        if kind == "zstd":
            self.reader = zstandard.ZstdDecompressor().stream_reader(self.data, read_across_frames=False)
        else:
            self.z, self.offset, self.tail = zlib.decompressobj(wbits=31), 0, b""

    def read(self, size: int) -> bytearray:
        """The next `size` bytes; fewer only where the stream ends first."""
        out, filled = bytearray(size), 0
        while filled < size:
            piece = self._inflate(min(size - filled, _OUT))
            if not piece:
                break
            out[filled:filled + len(piece)] = piece
            filled += len(piece)
        del out[filled:]
        return out

    def at_end(self) -> bool:
        """Whether the stream has no byte left, checked to its end (a gzip member's checksum)."""
        return not self._inflate(1)

    def _inflate(self, limit: int) -> bytes:
        """At most `limit` more bytes; nothing at the stream's proper end. A stream cut short or corrupt is refused."""
        try:
            if self.kind == "zstd":
                return self.reader.read(limit)  # a frame cut short ends early: the caller counts what it got
            while True:
                if self.z.eof:
                    end = self.offset - len(self.z.unused_data)  # what was handed over past the member's end
                    if end == len(self.data):
                        return b""
                    if bytes(self.data[end:end + 2]) != b"\x1f\x8b":
                        raise SplatwrightError(f"{self.name}: {self.what} is corrupt ({len(self.data) - end} bytes "
                                               "after its end)")
                    self.z, self.offset, self.tail = zlib.decompressobj(wbits=31), end, b""  # another member
                if not self.tail:
                    if self.offset == len(self.data):
                        raise SplatwrightError(f"{self.name}: {self.what} is truncated or corrupt (it ends early)")
                    self.tail = self.data[self.offset:self.offset + _PIECE]
                    self.offset += len(self.tail)
                out = self.z.decompress(self.tail, limit)
                self.tail = self.z.unconsumed_tail
                if out:
                    return out
        except zlib.error as e:
            raise SplatwrightError(f"{self.name}: {self.what} is truncated or corrupt ({e})") from None
        except Exception as e:
            if zstandard is not None and isinstance(e, zstandard.ZstdError):
                raise SplatwrightError(f"{self.name}: {self.what} is corrupt ({e})") from None
            raise


# --- PLY headers ------------------------------------------------------------------------------------------------

PLY_HEADER_BYTES = 1 << 16  # a PLY header ends within these (a 3DGS header takes about 1.5 KiB)
_PLY_SIZES = {"char": 1, "int8": 1, "uchar": 1, "uint8": 1, "short": 2, "int16": 2, "ushort": 2, "uint16": 2,
              "int": 4, "int32": 4, "uint": 4, "uint32": 4, "float": 4, "float32": 4, "double": 8, "float64": 8}


def check_ply_counts(head: bytes, size: int, name: str, budget: Budget, splats: str = "vertex") -> None:
    """Refuse a PLY (its first bytes `head`, `size` bytes in all) whose header declares more elements than the
    file holds (a binary row's bytes, or in text 2 bytes a value, times each element's count) or more `splats`
    rows than `budget` allows, before a reader allocates for them."""
    end = head.find(b"end_header")
    body = head.find(b"\n", end) + 1 if end >= 0 else 0
    if not body:
        raise SplatwrightError(f"{name}: unreadable PLY (no end_header within its first {len(head):,} bytes)")
    text, need, count, elements = "ascii", 0, 0, []
    for line in head[:end].decode("ascii", "replace").splitlines():
        words = line.split()
        if words[:1] == ["format"] and len(words) > 1:
            text = words[1]
        elif words[:1] == ["element"]:
            if len(words) != 3 or not words[2].isdigit():
                raise SplatwrightError(f"{name}: unreadable PLY (header line {line.strip()!r})")
            elements.append([words[1], int(words[2]), 0, 0])
        elif words[:1] == ["property"] and elements:
            element = elements[-1]
            element[2] += _PLY_SIZES.get(words[2] if words[1:2] == ["list"] and len(words) > 2 else
                                         words[1] if len(words) > 1 else "", 1)  # a list's count: it may be empty
            element[3] += 1
    for element, rows, row_bytes, values in elements:
        need += rows * (2 * values if text == "ascii" else row_bytes)
        if element == splats:
            count = rows
    budget.check_count(count, name)
    if need > size - body + (text == "ascii"):  # a text file's last line may end without a newline
        counts = f"the {elements[0][0]} count" if len(elements) == 1 else "the element counts"
        raise SplatwrightError(f"{name}: unreadable PLY (its header declares {need:,} bytes of elements, the file "
                               f"holds {size - body:,}); {counts} may not match the data")
