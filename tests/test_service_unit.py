"""Without a network: the one error mapping, config, codec and the servicer called directly."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from sapcore.errors import CapacityError, ConfigError, FrameError
from sapgrid.server import codec, errors
from sapgrid.server.metrics import Metrics
from sapgrid.server.registry import Registry
from sapgrid.server.servicer import SapgridServicer
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, world_pb2


@pytest.mark.parametrize("exc, code, field, index", [
    (FrameError("add_boxes", 3, "min > max on axis 1"), grpc.StatusCode.INVALID_ARGUMENT, "add_boxes", 3),
    (CapacityError("add_ids", "too many"), grpc.StatusCode.RESOURCE_EXHAUSTED, "add_ids", -1),
    (ConfigError("dims must be 2 or 3"), grpc.StatusCode.INVALID_ARGUMENT, "config", -1),
    (errors.WorldNotFound("w"), grpc.StatusCode.NOT_FOUND, "world", -1),
    (errors.WorldExists("x", "name"), grpc.StatusCode.ALREADY_EXISTS, "name", -1),
    (errors.DimsMismatch("3D", "add_boxes"), grpc.StatusCode.FAILED_PRECONDITION, "add_boxes", -1),
    (errors.Exhausted("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED, "", -1),
    (asyncio.CancelledError(), grpc.StatusCode.CANCELLED, "", -1),
    (RuntimeError("secret detail"), grpc.StatusCode.INTERNAL, "", -1),
])
def test_error_mapping(exc, code, field, index):
    got_code, message, got_field, got_index = errors.to_status(exc)
    assert (got_code, got_field, got_index) == (code, field, index)
    if code == grpc.StatusCode.INTERNAL:
        assert "secret" not in message                  # no internals leak to clients
    fe = errors.frame_error(exc)
    assert fe.code == code.value[0] and fe.field == field and fe.index == index


def test_decode_frame_is_zero_copy_and_checks_lengths():
    ids = np.arange(5, dtype="<u8")
    boxes = np.zeros((5, 4), "<f4")
    f = frame_pb2.Frame(add_ids=ids.tobytes(), add_boxes=boxes.tobytes())
    out = codec.decode_frame(f, 2)
    assert out["add_ids"].tolist() == ids.tolist() and out["add_boxes"].shape == (5, 4)
    assert not out["add_ids"].flags.writeable                 # a view of the message bytes
    with pytest.raises(errors.DimsMismatch):
        codec.decode_frame(frame_pb2.Frame(add_ids=ids.tobytes(), add_boxes=np.zeros((5, 6), "<f4").tobytes()), 2)
    with pytest.raises(errors.InvalidInput) as ei:
        codec.decode_frame(frame_pb2.Frame(update_ids=ids.tobytes(), update_boxes=b"\0" * 7), 2)
    assert ei.value.field == "update_boxes"


class FakeContext:
    """Just enough of grpc.aio.ServicerContext for unary handlers."""

    def __init__(self):
        self.status = None

    async def abort_with_status(self, status):
        self.status = status
        raise grpc.RpcError(status.details)

    async def abort(self, code, details=""):
        self.status = (code, details)
        raise grpc.RpcError(details)


def test_servicer_without_network():
    async def main():
        metrics = Metrics(process=False)
        with ThreadPoolExecutor(2) as pool:
            servicer = SapgridServicer(Registry(pool, metrics), metrics)
            ctx = FakeContext()
            cfg = world_pb2.WorldConfig(dims=2, bounds=[0, 0, 10, 10], cells=[2, 2])
            resp = await servicer.CreateWorld(pb.CreateWorldRequest(name="u", config=cfg), ctx)
            assert resp.world.name == "u" and list(resp.world.config.cells) == [2, 2]
            req = pb.ApplyFrameRequest(frame=frame_pb2.Frame(
                world="u", seq=4, add_ids=np.array([1, 2], "<u8").tobytes(),
                add_boxes=np.array([[0, 0, 1, 1], [1, 1, 2, 2]], "<f4").tobytes()))
            raw = await servicer.ApplyFrame(req.SerializeToString(), ctx)
            delta = pb.ApplyFrameResponse.FromString(raw).delta
            assert delta.seq == 4 and np.frombuffer(delta.created, "<u8").tolist() == [1, 2]
            with pytest.raises(grpc.RpcError):
                await servicer.GetWorld(pb.GetWorldRequest(name="nope"), ctx)
            assert ctx.status.code == grpc.StatusCode.NOT_FOUND
            listed = await servicer.ListWorlds(pb.ListWorldsRequest(), ctx)
            assert [w.name for w in listed.worlds] == ["u"] and listed.worlds[0].stats.pairs == 1
            await servicer.registry.close()

    asyncio.run(main())


def test_slow_subscriber_is_dropped_not_blocking():
    from sapgrid.server.registry import Subscriber

    async def main():
        sub = Subscriber(limit=3)
        for i in range(10):                      # the world never waits for a subscriber
            sub.offer(bytes([i]))
        got = []
        while (item := await sub.next()) is not None:
            got.append(item)
        return sub.dropped, got

    dropped, got = asyncio.run(main())
    assert dropped and got == [b"\x00", b"\x01", b"\x02"]
