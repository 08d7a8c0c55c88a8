"""Domain errors raised by sapcore. The server maps them to gRPC status codes in one place."""
from __future__ import annotations


class SapcoreError(Exception):
    """Base class of every error sapcore raises on purpose."""


class ConfigError(SapcoreError, ValueError):
    """A world configuration is invalid (dims, bounds, cells, limits)."""


class FrameError(SapcoreError, ValueError):
    """A frame is invalid; nothing was applied.

    Attributes
    ----------
    field : str
        The frame field at fault: ``remove_ids``, ``add_ids``, ``add_boxes``, ``add_category``,
        ``add_mask``, ``add_static``, ``update_ids`` or ``update_boxes``.
    index : int
        Row of that field at fault, or -1 when the fault is the field as a whole (shape, dtype).
    reason : str
        Human-readable reason, e.g. ``"min > max on axis 1"``.
    """

    def __init__(self, field: str, index: int, reason: str):
        self.field = field
        self.index = int(index)
        self.reason = reason
        where = f"{field}[{index}]" if index >= 0 else field
        super().__init__(f"{where}: {reason}")


class CapacityError(SapcoreError):
    """A world limit (max objects) would be exceeded by a frame; nothing was applied."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.index = -1
        self.reason = reason
        super().__init__(f"{field}: {reason}")
