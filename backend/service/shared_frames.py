"""Frames through shared memory for a client on the backend's own machine (protocol.SHARED_FRAMES): one file in
/dev/shm per connection, SHARED_SLOTS slots each as large as the largest raw frame the limits allow. The file is
sparse: a slot takes memory only as far as its frames have filled it, reserved with posix_fallocate before it is
written, so a full /dev/shm refuses the frame (it then goes in the reply's payload) rather than killing the
process with SIGBUS. On a GPU each slot's used part is page-locked (cudaHostRegister), so the frame's copy from
the device lands in the file itself; where that is refused, it is staged in pinned memory and copied over."""
from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from blender_addon.core.codecs import MAX_RAW_FRAME_BYTES_PER_PIXEL
from blender_addon.core.errors import SplatwrightError
from blender_addon.core.protocol import SHARED_SLOTS

FOLDER = Path("/dev/shm")  # memory, not a disk; where there is none (macOS, Windows) frames go through the socket
GROWTH = 1 << 20  # a slot's reserved part grows in steps of this many bytes


PREFIX = "splatwright-frames-"  # then the serving process's id, so a later server can remove what a killed one left

FREE, WRITING, WITH_CLIENT = "free", "being written", "with the client"  # a slot's states


def available() -> bool:
    return FOLDER.is_dir() and hasattr(os, "posix_fallocate")


def remove_stale_files() -> None:
    """Remove the shared-memory files of servers that were killed before they could (their process is gone)."""
    for path in FOLDER.glob(PREFIX + "*"):
        pid = path.name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not process_exists(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


@dataclass
class SharedSlot:
    owner: "SharedFrames"
    index: int
    bytes: torch.Tensor  # uint8 view of the slot's first `size` bytes
    pinned: bool  # page-locked for the GPU: the device's copy may land here directly


class SharedFrames:
    """One connection's shared-memory file and the state of each slot: free, being written by the render thread,
    or with the client (named by a sent reply, until the client releases it). The file's name is removed once the
    client maps it (its first shared render) and at close; its memory and page-locking go once no slot is being
    written, so a connection ending mid-frame never unmaps memory a render is still writing."""

    def __init__(self, max_frame_pixels: int, cuda: bool):
        frame_bytes = max_frame_pixels * MAX_RAW_FRAME_BYTES_PER_PIXEL  # the largest raw frame
        self.slot_bytes = -(-frame_bytes // GROWTH) * GROWTH
        self.cuda = cuda
        # Readable by this user only.
        fd, self.path = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=FOLDER)
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
        self.state = [FREE] * SHARED_SLOTS
        self.reserved = [0] * SHARED_SLOTS  # bytes of each slot reserved (and pinned, on a GPU)
        self.pinned = [False] * SHARED_SLOTS
        self.closed = self.unlinked = self.disposed = False

    def wire(self) -> dict:
        """What the hello's reply tells the client (protocol.SHARED_FRAMES)."""
        return {"path": self.path, "slot_bytes": self.slot_bytes}

    def take(self, size: int) -> SharedSlot | None:
        """A free slot, now being written, holding `size` bytes; None when every slot is busy or /dev/shm is full
        (the frame then goes in the reply). Give it back with sent() or discard()."""
        with self.lock:
            if self.closed or FREE not in self.state or size > self.slot_bytes:
                return None
            index = self.state.index(FREE)
            self.state[index] = WRITING
        self._unlink()  # the client asks for shared frames only once it has mapped the file
        start = index * self.slot_bytes
        if size > self.reserved[index]:
            if not self._reserve(index, min(self.slot_bytes, -(-size // GROWTH) * GROWTH)):
                self.discard(index)
                return None
        return SharedSlot(self, index, self.whole[start:start + size], self.pinned[index])

    def sent(self, index: int) -> None:
        """The slot's frame is written and its reply goes to the client, which releases it after its copy."""
        self._settle(index, WITH_CLIENT)

    def discard(self, index: int) -> None:
        """The slot's frame will not be sent: the slot is free again."""
        self._settle(index, FREE)

    def release(self, index: int) -> None:
        """The client copied slot `index`'s frame out: SplatwrightError for a slot not with the client."""
        with self.lock:
            if not 0 <= index < SHARED_SLOTS or self.state[index] != WITH_CLIENT:
                raise SplatwrightError(f"shared frame slot {index} holds no frame of yours to release; release a "
                                       "slot once, after the render reply that named it")
            self.state[index] = FREE

    def close(self) -> None:
        """The connection ended: remove the file now, and its memory once no slot is being written."""
        with self.lock:
            self.closed = True
        self._unlink()
        self._dispose_if_idle()

    def _settle(self, index: int, state: str) -> None:
        with self.lock:
            self.state[index] = state
        self._dispose_if_idle()

    def _unlink(self) -> None:
        with self.lock:
            if self.unlinked:
                return
            self.unlinked = True
        with contextlib.suppress(FileNotFoundError):  # /dev/shm may have been cleaned meanwhile
            os.unlink(self.path)

    def _dispose_if_idle(self) -> None:
        with self.lock:
            if not self.closed or self.disposed or WRITING in self.state:
                return
            self.disposed = True
        try:
            if self.cuda:
                torch.cuda.synchronize()  # no copy into a slot is still on its way when the slots are unpinned
            for index in range(SHARED_SLOTS):
                self._unpin(index)
        finally:
            del self.whole
            self.map.close()
            os.close(self.fd)

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


def cuda_call(call) -> int:
    """The CUDA error code `call` returns (0: success), called on a thread of its own: a failure is also left as
    the calling thread's last CUDA error, which torch would report as the failure of that thread's next kernel."""
    code = []
    thread = threading.Thread(target=lambda: code.append(int(call())))
    thread.start()
    thread.join()
    return code[0] if code else -1
