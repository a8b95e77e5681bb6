"""Typed errors with messages that say what was expected, what was given and how to fix it.

attnkit raises the built-in types so that ``except ValueError`` keeps working:

- ``ValueError`` / ``TypeError`` for bad input (``AttnkitValueError`` / ``AttnkitTypeError``),
- ``NotImplementedError`` for legal requests a backend cannot serve (``BackendUnsupportedError``),
- ``RuntimeError`` for the environment (``EnvironmentError_``).
"""

from __future__ import annotations


class AttnkitError(Exception):
    """Base class of every attnkit error (also a subclass of the matching built-in)."""


class AttnkitValueError(AttnkitError, ValueError):
    """An argument has the right type but a bad value or shape."""


class AttnkitTypeError(AttnkitError, TypeError):
    """An argument has the wrong type or dtype."""


class BackendUnsupportedError(AttnkitError, NotImplementedError):
    """A legal request that the chosen backend cannot serve; ``reasons`` lists why."""

    def __init__(self, message: str, reasons: list[str] | None = None):
        super().__init__(message)
        self.reasons = list(reasons or [])


class EnvironmentUnsupportedError(AttnkitError, RuntimeError):
    """The environment (device, PyTorch build) lacks something the request needs."""


def describe(value: object) -> str:
    """A short description of ``value`` for error messages (tensors by shape and dtype)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        device = getattr(value, "device", None)
        return f"tensor(shape={tuple(shape)}, dtype={dtype}, device={device})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
