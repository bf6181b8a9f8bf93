"""Frames through shared memory for a client on the backend's own machine (protocol.SHARED_FRAMES): one file in
/dev/shm per connection, SHARED_SLOTS slots each as large as the largest raw frame the limits allow. The file is
sparse: a slot takes memory only as far as its frames have filled it, reserved with posix_fallocate before it is
written, so a full /dev/shm refuses the frame (it then goes in the reply's payload) rather than killing the
process with SIGBUS. On a GPU each slot's used part is page-locked (cudaHostRegister), so the frame's copy from
the device lands in the file itself; where that is refused, it is staged in pinned memory and copied over."""
from __future__ import annotations

import mmap
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from blender_addon.core.codecs import LAYER_BYTES_PER_PIXEL
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import SHARED_SLOTS

FOLDER = Path("/dev/shm")  # memory, not a disk; where there is none (macOS, Windows) frames go through the socket
GROWTH = 1 << 20  # a slot's reserved part grows in steps of this many bytes


def available() -> bool:
    return FOLDER.is_dir() and hasattr(os, "posix_fallocate")


@dataclass
class SharedSlot:
    owner: "SharedFrames"
    index: int
    bytes: torch.Tensor  # uint8 view of the slot's first `size` bytes
    pinned: bool  # page-locked for the GPU: the device's copy may land here directly


class SharedFrames:
    """One connection's shared-memory file and which of its slots hold a frame the client has not released."""

    def __init__(self, max_frame_pixels: int, cuda: bool):
        frame_bytes = max_frame_pixels * LAYER_BYTES_PER_PIXEL  # the largest raw frame: a layer, or RGBA8 + depth
        self.slot_bytes = -(-frame_bytes // GROWTH) * GROWTH
        self.cuda = cuda
        fd, self.path = tempfile.mkstemp(prefix="splatwright-frames-", dir=FOLDER)  # readable by this user only
        try:
            os.ftruncate(fd, SHARED_SLOTS * self.slot_bytes)
            self.map = mmap.mmap(fd, SHARED_SLOTS * self.slot_bytes)
        except OSError:
            os.close(fd)
            os.unlink(self.path)
            raise
        self.fd = fd
        self.whole = torch.frombuffer(self.map, dtype=torch.uint8)
        self.lock = threading.Lock()
        self.free = list(range(SHARED_SLOTS))
        self.reserved = [0] * SHARED_SLOTS  # bytes of each slot reserved (and pinned, on a GPU)
        self.pinned = [False] * SHARED_SLOTS
        self.closed = False

    def wire(self) -> dict:
        """What the hello's reply tells the client (protocol.SHARED_FRAMES)."""
        return {"path": self.path, "slot_bytes": self.slot_bytes}

    def take(self, size: int) -> SharedSlot | None:
        """A free slot holding `size` bytes, or None when every slot waits for the client or /dev/shm is full
        (the frame then goes in the reply)."""
        with self.lock:
            if self.closed or not self.free or size > self.slot_bytes:
                return None
            index = self.free.pop(0)
        start = index * self.slot_bytes
        if size > self.reserved[index]:
            if not self._reserve(index, min(self.slot_bytes, -(-size // GROWTH) * GROWTH)):
                self.release(index)
                return None
        return SharedSlot(self, index, self.whole[start:start + size], self.pinned[index])

    def _reserve(self, index: int, size: int) -> bool:
        start = index * self.slot_bytes
        try:
            os.posix_fallocate(self.fd, start, size)
        except OSError:
            return False
        if self.cuda:
            self._unpin(index)
            address = self.whole[start:].data_ptr()
            self.pinned[index] = cuda_call(lambda: torch.cuda.cudart().cudaHostRegister(address, size, 0)) == 0
        self.reserved[index] = size
        return True

    def _unpin(self, index: int) -> None:
        if self.pinned[index]:
            address = self.whole[index * self.slot_bytes:].data_ptr()
            cuda_call(lambda: torch.cuda.cudart().cudaHostUnregister(address))
            self.pinned[index] = False

    def release(self, index: int) -> None:
        """The client copied slot `index`'s frame out (or it was never sent): SplatwrightError for a slot not
        holding one."""
        with self.lock:
            if index in self.free or not 0 <= index < SHARED_SLOTS:
                raise SplatwrightError(f"shared frame slot {index} holds no frame to release; release a slot once, "
                                       "after the render reply that named it")
            self.free.append(index)

    def close(self) -> None:
        """Remove the file; its memory goes once the client has unmapped it too."""
        with self.lock:
            self.closed = True
        if self.cuda:
            torch.cuda.synchronize()  # no copy into a slot is still on its way when the slots are unpinned
        for index in range(SHARED_SLOTS):
            self._unpin(index)
        del self.whole
        try:
            self.map.close()
        except BufferError:  # a render still holds a slot's view: the mapping goes with it
            pass
        os.close(self.fd)
        os.unlink(self.path)


def cuda_call(call) -> int:
    """The CUDA error code `call` returns (0: success), called on a thread of its own: a failure is also left as
    the calling thread's last CUDA error, which torch would report as the failure of that thread's next kernel."""
    code = []
    thread = threading.Thread(target=lambda: code.append(int(call())))
    thread.start()
    thread.join()
    return code[0] if code else -1
