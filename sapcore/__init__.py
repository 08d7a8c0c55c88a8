"""sapcore: the multi-SAP broadphase engine of sapgrid. The public API is described in sapcore/API.md."""
from .errors import CapacityError, ConfigError, FrameError, SapcoreError
from .types import Delta, FrameStats, WorldConfig

__all__ = ["CapacityError", "ConfigError", "Delta", "FrameError", "FrameStats", "SapcoreError", "WorldConfig"]

try:  # the engine lands in sapcore/world.py
    from .world import World, auto_cells  # noqa: F401
    __all__ += ["World", "auto_cells"]
except ImportError:  # pragma: no cover
    pass
