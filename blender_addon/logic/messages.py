"""Text for Blender's reports and the sidebar's labels (bpy-free): one line per report, labels wrapped to the
panel's width, and the line of a backend's log that says why it ended."""
from __future__ import annotations

import textwrap

ELLIPSIS = "\u2026"
# What starts the backend's own error lines (the command line's `error: ...`); its other log lines say what it
# did, not why it ended.
ERROR_PREFIXES = ("error:",)
TRACEBACK_START = "Traceback (most recent call last):"


def one_line(text: str) -> str:
    """A message as one line: its lines joined, runs of whitespace made one space."""
    return " ".join(str(text).split())


def at_step(step: int) -> str:
    """" at step N" for a trained model's step; nothing for an imported model's, which has none (0)."""
    return f" at step {step}" if step else ""


def wrap(text: str, width: int, max_lines: int = 4) -> list[str]:
    """`text` in lines of at most `width` characters, at most `max_lines` of them; a word longer than a line
    is broken, and text beyond the last line ends it with an ellipsis."""
    width = max(8, width)
    lines = textwrap.wrap(one_line(text), width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][:width - 1].rstrip() + ELLIPSIS
    return lines


def last_error_line(log: list[str]) -> str:
    """The line of a process's log (oldest first) that says why it failed: the latest of the lines starting
    with one of ERROR_PREFIXES and the exception lines that end tracebacks, or ''. Warnings and other chatter
    (a torch warning's source line, say) are never it."""
    found = ""
    in_traceback = False
    for line in log:
        stripped = line.strip()
        if stripped == TRACEBACK_START:
            in_traceback = True
        elif in_traceback and stripped and not line[:1].isspace():
            found, in_traceback = stripped, False  # the exception's own line ends a traceback
        elif stripped.lower().startswith(ERROR_PREFIXES):
            found = stripped
    return found
