"""sapcore: the multi-SAP broadphase engine of sapgrid. The public API is described in sapcore/API.md."""
from .errors import CapacityError, ConfigError, FrameError, SapcoreError
from .types import Delta, FrameStats, WorldConfig
from .world import World, auto_cells

__all__ = ["CapacityError", "ConfigError", "Delta", "FrameError", "FrameStats", "SapcoreError", "World",
           "WorldConfig", "auto_cells"]
