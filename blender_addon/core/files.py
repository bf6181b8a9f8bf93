"""Files written whole or not at all: through a temporary file beside the target, renamed over it, so a crash
never leaves a half-written file. Stdlib only (the add-on shares it)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: str | Path):
    """Yields the temporary path to write; it replaces `path` when the block ends without an error."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def write_atomic(path: str | Path, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
