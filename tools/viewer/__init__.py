"""``sapgrid view``: a live web viewer of a server's worlds (a gRPC client of the server)."""
from sapgrid.tools.viewer.app import make_app, run

__all__ = ["make_app", "run"]
