"""Each call of the service defined once: the request it sends and how its answer is read.

``Client`` runs them synchronously, ``AsyncClient`` as coroutines: both implement ``_unary(method,
request, read, timeout)``; the methods below return what it returns (a value, or an awaitable).
"""
from __future__ import annotations

import re

import grpc

from sapgrid import DEFAULT_ADDRESS
from sapgrid.v1 import sapgrid_service_pb2 as pb

from .codec import (FrameStats, RemoteDelta, WorldConfig, WorldInfo, config_message, delta_from, encode_frame,
                    info_from, pairs_array, query_result, region_values)
from .errors import from_frame_error, make_error

DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Client channel arguments: bounded message sizes and keepalive pings for long-lived streams."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def check_size(request, limit: int) -> None:
    """Refuse a request larger than the channel's message limit before it is sent (gRPC would end the
    whole stream with a terse RESOURCE_EXHAUSTED)."""
    size = request.ByteSize()
    if size > limit:
        raise make_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"frame: {size} bytes is more than the message limit of {limit} bytes; raise it on both "
                         f"sides (Client(max_message_bytes=...) and sapgrid serve --max-message-bytes) or send "
                         f"the objects in several frames", "frame")


WORLD_HEADER = "x-sapgrid-world"


_WORLD_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def world_metadata(world: str):
    """The call's gRPC metadata: the world it names in ``x-sapgrid-world`` (the cluster proxy routes by
    it; a frame stream opened with a world is bound to it). None for a call that names no world, or a
    name no world can have (the server answers that call with its own error; such a name in a header
    could exceed gRPC's metadata limit)."""
    return ((WORLD_HEADER, world),) if world and _WORLD_NAME.fullmatch(world) else None


def frame_request(world: str, seq: int, arrays: dict, writer: str = "") -> pb.StreamFramesRequest:
    request = pb.StreamFramesRequest()
    encode_frame(world, seq, **arrays, writer=writer, into=request.frame)
    return request


SNAPSHOT_CHUNK = 1 << 20


def restore_requests(data: bytes, name: str | None):
    """The RestoreWorld messages of a snapshot: its bytes in chunks of 1 MiB, the name in the first."""
    view = memoryview(data)
    first = True
    for start in range(0, max(len(view), 1), SNAPSHOT_CHUNK):
        yield pb.RestoreWorldRequest(name=(name or "") if first else "", chunk=bytes(view[start:start + SNAPSHOT_CHUNK]))
        first = False


def frame_answer(resp: pb.StreamFramesResponse) -> RemoteDelta:
    """The delta of a frame stream's answer; raises the frame's typed error if it was refused."""
    if resp.WhichOneof("result") == "error":
        raise from_frame_error(resp.error)
    return delta_from(resp.delta)


def subscribe_request(world: str, region=None) -> pb.SubscribeRequest:
    """Subscribe to every delta, or with region (2*dims values, mins then maxs) to the pairs entering and
    leaving the view of pairs with an object whose box intersects it."""
    return pb.SubscribeRequest(world=world, region=[] if region is None else region_values(region))


def _world(resp) -> WorldInfo:
    return info_from(resp.world)


class Calls:
    """The unary calls, shared by Client and AsyncClient."""

    stub = None
    max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES

    def _unary(self, method, request, read, timeout=None, world=""):  # pragma: no cover - implemented by the clients
        raise NotImplementedError

    # ---- worlds -----------------------------------------------------------------------------
    def create_world(self, name: str, config: WorldConfig | None = None, *, dims: int = 2, bounds=None, cells=None,
                     expected_objects: int = 0, if_not_exists: bool = False) -> WorldInfo:
        """Create a world from a config object (sapcore.WorldConfig or WorldConfig), or from
        dims/bounds/cells (cells None: the server picks)."""
        msg = config_message(config, dims=dims, bounds=bounds, cells=cells, expected_objects=expected_objects)
        return self._unary(self.stub.CreateWorld, pb.CreateWorldRequest(name=name, config=msg,
                                                                        if_not_exists=if_not_exists), _world, world=name)

    def delete_world(self, name: str) -> None:
        return self._unary(self.stub.DeleteWorld, pb.DeleteWorldRequest(name=name), lambda resp: None, world=name)

    def list_worlds(self) -> list[WorldInfo]:
        return self._unary(self.stub.ListWorlds, pb.ListWorldsRequest(),
                           lambda resp: [info_from(w) for w in resp.worlds])

    def server_version(self) -> str:
        """The server's version (from ListWorlds' answer)."""
        return self._unary(self.stub.ListWorlds, pb.ListWorldsRequest(), lambda resp: resp.server_version)

    def get_world(self, name: str) -> WorldInfo:
        return self._unary(self.stub.GetWorld, pb.GetWorldRequest(name=name), _world, world=name)

    def freeze(self, name: str, frozen: bool = True) -> WorldInfo:
        """Freeze a world (its frames answered UNAVAILABLE "moving"; reads and snapshots still served), or
        unfreeze it with ``frozen=False``."""
        return self._unary(self.stub.FreezeWorld, pb.FreezeWorldRequest(name=name, frozen=frozen), _world, world=name)

    # ---- frames and queries -----------------------------------------------------------------
    def step(self, world: str, seq: int = 0, *, writer: str = "", timeout: float | None = None,
             **arrays) -> RemoteDelta:
        """Apply one frame with a unary call (arrays as ``sapcore.World.step`` keywords).

        writer: exactly-once frames (Frame.writer in the contract): ``seq`` is then the frame's place in
        the writer's sequence, and a frame sent again is answered with its first delta, never re-applied."""
        request = pb.ApplyFrameRequest(frame=encode_frame(world, seq, **arrays, writer=writer))
        check_size(request, self.max_message_bytes)
        return self._unary(self.stub.ApplyFrame, request, lambda resp: delta_from(resp.delta), timeout, world)

    def query(self, world: str, region, include_boxes: bool = False):
        """Sorted uint64 ids of the live boxes intersecting region (2*dims floats); with boxes: (ids, boxes)."""
        request = pb.QueryRegionRequest(world=world, region=region_values(region), include_boxes=include_boxes)
        return self._unary(self.stub.QueryRegion, request, lambda resp: query_result(resp, include_boxes), world=world)

    def list_pairs(self, world: str, page_size: int = 0, page_token: str = ""):
        """One page of active pairs: (uint64 [K, 2], next_page_token or "")."""
        request = pb.ListPairsRequest(world=world, page_size=page_size, page_token=page_token)
        return self._unary(self.stub.ListPairs, request, lambda resp: (pairs_array(resp.pairs), resp.next_page_token),
                           world=world)


def is_cancelled(err: grpc.RpcError) -> bool:
    return err.code() == grpc.StatusCode.CANCELLED


__all__ = ["Calls", "DEFAULT_ADDRESS", "restore_requests", "DEFAULT_MAX_MESSAGE_BYTES", "FrameStats", "channel_options", "frame_answer",
           "frame_request", "is_cancelled", "WORLD_HEADER", "world_metadata"]
