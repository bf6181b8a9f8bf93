"""The small validation language the protocol and the training settings are written in.

A kind checks one JSON value and returns it normalised (`check`, what a receiver does), or raises ValueError
saying what is wrong; `encode` turns a Python value into the JSON a receiver checks (most kinds take the JSON
value as it is; Camera's kind takes a Camera). Standard library + numpy only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_TEXT_CHARS = 4096


def _kind(value) -> str:
    return "null" if value is None else type(value).__name__


class Kind:
    def check(self, value):
        raise NotImplementedError

    def encode(self, value):
        return value


class Int(Kind):
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_kind(value)}")
        if not self.lo <= value <= self.hi:
            raise ValueError(f"{value} is outside [{self.lo}, {self.hi}]")
        return value


class Float(Kind):
    def __init__(self, lo: float, hi: float):
        self.lo, self.hi = lo, hi

    def check(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_kind(value)}")
        if not self.lo <= value <= self.hi:  # also rejects NaN
            raise ValueError(f"{value} is outside [{self.lo}, {self.hi}]")
        return float(value)


class Bool(Kind):
    def check(self, value):
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_kind(value)}")
        return value


class Str(Kind):
    def __init__(self, max_chars: int = MAX_TEXT_CHARS, choices: tuple[str, ...] = (), pattern: str = ""):
        self.max_chars, self.choices = max_chars, choices
        self.pattern = re.compile(pattern) if pattern else None

    def check(self, value):
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {_kind(value)}")
        if len(value) > self.max_chars:
            raise ValueError(f"string of {len(value)} characters, more than {self.max_chars}")
        if self.choices and value not in self.choices:
            raise ValueError(f"{value[:40]!r} is not one of {', '.join(self.choices)}")
        if self.pattern and not self.pattern.fullmatch(value):
            raise ValueError(f"{value[:40]!r} does not match {self.pattern.pattern}")
        return value


class Maybe(Kind):
    """`kind` or null."""

    def __init__(self, kind: Kind):
        self.kind = kind

    def check(self, value):
        return None if value is None else self.kind.check(value)

    def encode(self, value):
        return None if value is None else self.kind.encode(value)


class Numbers(Kind):
    """A fixed-shape nested list of finite numbers in [lo, hi], e.g. a 4x4 matrix or an RGB triple."""

    def __init__(self, shape: tuple[int, ...], lo: float = -1e12, hi: float = 1e12):
        self.shape, self.lo, self.hi = shape, lo, hi

    def check(self, value):
        def walk(v, depth):
            if depth == len(self.shape):
                return Float(self.lo, self.hi).check(v)
            if not isinstance(v, list) or len(v) != self.shape[depth]:
                raise ValueError(f"expected a list of shape {list(self.shape)}")
            return [walk(x, depth + 1) for x in v]
        return walk(value, 0)

    def encode(self, value):
        if hasattr(value, "tolist"):  # a numpy array
            return value.tolist()
        if len(self.shape) == 1 and isinstance(value, tuple):
            return list(value)
        return value


class AnyObject(Kind):
    """A JSON object whose contents the receiver interprets; the header cap bounds it."""

    def check(self, value):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_kind(value)}")
        return value


_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    kind: Kind
    default: object = _REQUIRED
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


def optional(kind: Kind, default=None, help: str = "") -> Field:
    return Field(kind, default, help)


class Fields(Kind):
    """A JSON object with named, typed fields; unknown names are rejected, missing optional ones filled in
    with their defaults."""

    def __init__(self, **fields: "Field | Kind"):
        self.fields = {name: f if isinstance(f, Field) else Field(f) for name, f in fields.items()}

    def check(self, value):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_kind(value)}")
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise ValueError(f"unknown field {unknown[0][:40]!r}; known: {', '.join(self.fields) or 'none'}")
        out = {}
        for name, f in self.fields.items():
            if name in value:
                try:
                    out[name] = f.kind.check(value[name])
                except ValueError as e:
                    raise ValueError(f"{name}: {e}") from None
            elif f.required:
                raise ValueError(f"missing field {name!r}")
            else:
                out[name] = f.default
        return out

    def encode(self, value):
        if not isinstance(value, dict):
            return value  # check() says what is wrong
        return {name: self.fields[name].kind.encode(v) if name in self.fields else v for name, v in value.items()}

    def defaults(self) -> dict:
        """Every optional field's default."""
        return {name: f.default for name, f in self.fields.items() if not f.required}

    def extended(self, **more: "Field | Kind") -> "Fields":
        """These fields and `more`."""
        return Fields(**self.fields, **more)


@dataclass(frozen=True)
class MessageSpec:
    fields: Kind = field(default_factory=Fields)
    max_payload: int = 0
