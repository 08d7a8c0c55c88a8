"""sapgrid.client: the Python client of the sapgrid service (needs grpcio, protobuf and numpy only)."""
from .sync import *  # noqa: F401,F403
from .sync import __all__  # noqa: F401
