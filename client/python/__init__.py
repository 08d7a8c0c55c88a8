"""sapgrid.client: the Python client of the sapgrid service (needs grpcio, protobuf and numpy only).

Example::

    from sapgrid.client import Client
    with Client("127.0.0.1:50051") as c:
        c.create_world("w", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        with c.stream("w") as s:
            d = s.step(add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
            print(d.created)          # uint64 [[1, 2]]

Errors: every failure raises a ``sapgrid.client.errors.SapgridError`` subclass carrying the server's
message, ``field`` and ``index`` (a rejected frame of a stream raises from ``recv``/``step`` and the
stream stays usable).
"""
from ._calls import DEFAULT_ADDRESS, DEFAULT_MAX_MESSAGE_BYTES, channel_options
from .aio import AsyncClient, AsyncFrameStream, AsyncSubscription
from .codec import FrameStats, RemoteDelta, WorldConfig, WorldInfo
from .errors import SapgridError
from .sync import Client, FrameStream, Subscription

__all__ = ["AsyncClient", "AsyncFrameStream", "AsyncSubscription", "Client", "DEFAULT_ADDRESS", "DEFAULT_MAX_MESSAGE_BYTES",
           "FrameStats", "FrameStream", "RemoteDelta", "SapgridError", "Subscription", "WorldConfig", "WorldInfo", "channel_options"]
