"""Bad input never crashes or corrupts: every rejected frame names the offending entry, changes nothing,
and a stream stays usable after it."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from sapcore import WorldConfig
from sapgrid.client import Client
from sapgrid.client.codec import encode_frame
from sapgrid.client.errors import (FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, SapgridError,
                                   from_rpc_error)
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb
from service_helpers import assert_same_pairs, random_boxes

CFG = WorldConfig(dims=2, bounds=(0, 0, 100, 100), cells=(4, 4), max_objects=1000)
NAN, INF = float("nan"), float("inf")


def _raw(**fields) -> frame_pb2.Frame:
    return frame_pb2.Frame(**fields)


def _u64(*v) -> bytes:
    return np.array(v, "<u8").tobytes()


def _f32(*rows) -> bytes:
    return np.array(rows, "<f4").tobytes()


# (description, frame kwargs for client encoding OR raw Frame fields, expected error class, field, index)
BAD_FRAMES = [
    ("nan", dict(add_ids=[1000], add_boxes=[[0, 0, NAN, 1]]), InvalidArgument, "add_boxes", 0),
    ("inf", dict(add_ids=[1000, 1001], add_boxes=[[0, 0, 1, 1], [0, -INF, 1, 1]]), InvalidArgument, "add_boxes", 1),
    ("min>max", dict(add_ids=[1000], add_boxes=[[0, 5, 1, 1]]), InvalidArgument, "add_boxes", 0),
    ("update nan", dict(update_ids=[1], update_boxes=[[NAN, 0, 1, 1]]), InvalidArgument, "update_boxes", 0),
    ("huge coordinate", dict(add_ids=[1000], add_boxes=[[0, 0, 1e30, 1]]), InvalidArgument, "add_boxes", 0),
    ("duplicate add", dict(add_ids=[1000, 1000], add_boxes=[[0, 0, 1, 1]] * 2), InvalidArgument, "add_ids", 1),
    ("add live id", dict(add_ids=[5], add_boxes=[[0, 0, 1, 1]]), InvalidArgument, "add_ids", 0),
    ("unknown update", dict(update_ids=[999_999], update_boxes=[[0, 0, 1, 1]]), InvalidArgument, "update_ids", 0),
    ("unknown remove", dict(remove_ids=[1, 999_999]), InvalidArgument, "remove_ids", 1),
    ("id twice in frame", dict(remove_ids=[3], update_ids=[3], update_boxes=[[0, 0, 1, 1]]), InvalidArgument,
     None, None),
    ("ids bytes", _raw(remove_ids=b"\x01\x02\x03"), InvalidArgument, "remove_ids", -1),
    ("boxes bytes", _raw(add_ids=_u64(1000), add_boxes=b"\x00" * 12), InvalidArgument, "add_boxes", -1),
    ("update boxes missing", _raw(update_ids=_u64(1, 2)), InvalidArgument, "update_boxes", -1),
    ("category bytes", _raw(add_ids=_u64(1000), add_boxes=_f32([0, 0, 1, 1]), add_category=b"\x01\x00"),
     InvalidArgument, "add_category", -1),
    ("mask bytes", _raw(add_ids=_u64(1000), add_boxes=_f32([0, 0, 1, 1]), add_mask=b"\x01" * 8), InvalidArgument,
     "add_mask", -1),
    ("static value", _raw(add_ids=_u64(1000, 1001), add_boxes=_f32([0, 0, 1, 1], [0, 0, 1, 1]),
                          add_static=b"\x00\x07"), InvalidArgument, "add_static", 1),
    ("3d boxes in 2d world", _raw(add_ids=_u64(1000), add_boxes=_f32([0, 0, 0, 1, 1, 1])), FailedPrecondition,
     "add_boxes", -1),
    ("too many objects", dict(add_ids=np.arange(10_000, 11_000), add_boxes=np.tile([[0, 0, 1, 1]], (1000, 1))),
     ResourceExhausted, None, None),
]


def _frame(world: str, seq: int, spec) -> frame_pb2.Frame:
    if isinstance(spec, frame_pb2.Frame):
        f = frame_pb2.Frame()
        f.CopyFrom(spec)
        f.world, f.seq = world, seq
        return f
    return encode_frame(world, seq, **spec)


@pytest.fixture
def populated(client, world_name, rng):
    client.create_world(world_name, CFG)
    n = 200
    client.step(world_name, add_ids=np.arange(1, n + 1), add_boxes=random_boxes(rng, n, side=60, size=8))
    yield world_name
    client.delete_world(world_name)


def _snapshot(client: Client, world: str):
    info = client.get_world(world)
    return (client.pairs(world), client.query(world, [0, 0, 100, 100], include_boxes=True),
            (info.objects, info.pairs, info.frames))


def _assert_unchanged(before, after):
    assert_same_pairs(before[0], after[0])
    np.testing.assert_array_equal(before[1][0], after[1][0])
    np.testing.assert_array_equal(before[1][1], after[1][1])
    assert before[2] == after[2]


def _check_error(err: SapgridError, cls, field, index):
    assert isinstance(err, cls), f"{type(err).__name__}: {err}"
    assert err.message
    if field is not None:
        assert err.field == field, err
        assert err.index == index, err
        assert field in err.message


@pytest.mark.parametrize("desc, spec, cls, field, index", BAD_FRAMES, ids=[b[0] for b in BAD_FRAMES])
def test_unary_bad_frame_changes_nothing(client, populated, desc, spec, cls, field, index):
    before = _snapshot(client, populated)
    with pytest.raises(cls) as ei:
        try:
            client.stub.ApplyFrame(pb.ApplyFrameRequest(frame=_frame(populated, 1, spec)))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
    _check_error(ei.value, cls, field, index)
    _assert_unchanged(before, _snapshot(client, populated))
    assert client.get_world(populated).frames_rejected == 1


def test_unary_error_carries_bad_request_detail(client, populated):
    with pytest.raises(grpc.RpcError) as ei:
        client.stub.ApplyFrame(pb.ApplyFrameRequest(frame=encode_frame(populated, 1, add_ids=[1000, 1001],
                                                                       add_boxes=[[0, 0, 1, 1], [0, 3, 1, 1]])))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "add_boxes[1]" in ei.value.details()
    status = rpc_status.from_call(ei.value)
    br = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(br)
    assert br.field_violations[0].field == "add_boxes[1]"


def test_stream_reports_errors_in_place_and_goes_on(client, populated):
    before = _snapshot(client, populated)
    with client.stream(populated) as s:
        for i, (desc, spec, cls, field, index) in enumerate(BAD_FRAMES):
            s.send_message(_frame(populated, 1000 + i, spec))
        s.send(seq=5000, update_ids=[1], update_boxes=[[0, 0, 1, 1]])          # a good frame at the end
        for i, (desc, spec, cls, field, index) in enumerate(BAD_FRAMES):
            with pytest.raises(cls) as ei:
                s.recv()
            _check_error(ei.value, cls, field, index)
        good = s.recv()
        assert good.seq == 5000 and good.frame == before[2][2] + 1
    after = _snapshot(client, populated)
    assert after[2][2] == before[2][2] + 1                                      # only the good frame applied


def test_stream_raw_error_slot_carries_seq_and_code(client, populated):
    requests = iter([pb.StreamFramesRequest(frame=_frame(populated, 42, dict(add_ids=[1], add_boxes=[[0, 0, 1, 1]])))])
    resp = next(client.stub.StreamFrames(requests))
    assert resp.seq == 42 and resp.WhichOneof("result") == "error"
    assert resp.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert resp.error.field == "add_ids" and resp.error.index == 0


def test_unknown_world(client):
    with pytest.raises(NotFound) as ei:
        client.step("no-such-world", add_ids=[1], add_boxes=[[0, 0, 1, 1]])
    assert ei.value.field == "world" and "no-such-world" in ei.value.message
    with client.stream("no-such-world") as s:
        with pytest.raises(NotFound):
            s.step(add_ids=[1], add_boxes=[[0, 0, 1, 1]])
        with pytest.raises(NotFound):
            s.step(remove_ids=[1])                      # still usable
    with pytest.raises(NotFound):
        client.query("no-such-world", [0, 0, 1, 1])
    with pytest.raises(NotFound):
        client.pairs("no-such-world")
    with pytest.raises(NotFound):
        client.list_pairs("no-such-world")


def test_bad_query_region(client, populated):
    with pytest.raises(FailedPrecondition) as ei:
        client.query(populated, [0, 0, 0, 1, 1, 1])
    assert ei.value.field == "region"
    with pytest.raises(InvalidArgument):
        client.query(populated, [0, 0, 1])
    with pytest.raises(InvalidArgument):
        client.query(populated, [0, 0, NAN, 1])


def test_oversized_message_is_refused_and_server_lives(make_server):
    srv = make_server(max_message_bytes=64 * 1024)
    with Client(srv.address, max_message_bytes=16 << 20) as c:
        n = 10_000                                   # 240 kB > 64 kB
        with pytest.raises(ResourceExhausted):
            c.step("default", add_ids=np.arange(n), add_boxes=np.tile([[0, 0, 1, 1]], (n, 1)))
        assert c.get_world("default").objects == 0
        d = c.step("default", add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])
        assert d.created.tolist() == [[1, 2]]


def test_a_frame_over_the_clients_message_limit_is_refused_before_it_is_sent(server, world_name):
    """A frame larger than the channel's limit fails at once with a message saying how to raise it; the
    stream stays usable (gRPC itself would end the whole stream)."""
    n = 5_000                                                    # 120 kB > 64 kB
    big = dict(add_ids=np.arange(n), add_boxes=np.tile([[0, 0, 1, 1]], (n, 1)))
    with Client(server.address, max_message_bytes=64 * 1024) as c:
        c.create_world(world_name, dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
        with pytest.raises(ResourceExhausted, match="max-message-bytes") as ei:
            c.step(world_name, **big)
        assert ei.value.field == "frame"
        with c.stream(world_name) as s:
            with pytest.raises(ResourceExhausted, match="message limit"):
                s.send(**big)
            assert s.step(add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]]).created.tolist() == [[1, 2]]
        assert c.get_world(world_name).frames == 1


def test_memory_budgets_refuse_worlds_and_frames_before_they_take_memory(make_server):
    """A grid too big for the per-world budget, a world past the server's budget, and a frame whose new
    objects would pass the per-world budget are RESOURCE_EXHAUSTED naming the budget; nothing changes."""
    srv = make_server(default_world="", max_world_bytes=16 << 20, max_server_bytes=21 << 20)
    with Client(srv.address) as c:
        with pytest.raises(ResourceExhausted, match="--max-world-bytes"):
            c.create_world("huge", dims=2, bounds=(0, 0, 100, 100), cells=(2048, 2048))
        assert [w.name for w in c.list_worlds()] == []
        c.create_world("a", dims=2, bounds=(0, 0, 100, 100), cells=(400, 400))       # ~11 MiB of grid
        with pytest.raises(ResourceExhausted, match="--max-server-bytes"):
            c.create_world("b", dims=2, bounds=(0, 0, 100, 100), cells=(400, 400))
        assert [w.name for w in c.list_worlds()] == ["a"]
        c.create_world("small", dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        n = 20_000                                                                     # ~8 MiB of objects
        lo = np.stack([np.arange(n) % 141, np.arange(n) // 141], 1) * 0.7               # apart: no pairs
        boxes = np.concatenate([lo, lo + 0.1], 1)
        with pytest.raises(ResourceExhausted, match="--max-world-bytes"):
            c.step("a", 1, add_ids=np.arange(n), add_boxes=boxes)
        assert c.get_world("a").objects == 0 and c.get_world("a").frames_rejected == 1
        c.step("small", 1, add_ids=np.arange(n), add_boxes=boxes)                   # fits
        c.delete_world("a")                                                            # gives its budget back
        c.create_world("b", dims=2, bounds=(0, 0, 100, 100), cells=(400, 400))
