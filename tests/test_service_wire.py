"""The zero-copy frame reader agrees with protobuf; malformed request bytes are INVALID_ARGUMENT."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from sapgrid.client.codec import encode_frame
from sapgrid.server.errors import InvalidInput
from sapgrid.server.protocol import FrameView, read_frame, varint_field, wrap
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb

FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
          "update_boxes")


def _same(view, frame: frame_pb2.Frame):
    assert view.world == frame.world and view.seq == frame.seq and view.writer == frame.writer
    for f in FIELDS:
        assert bytes(getattr(view, f)) == getattr(frame, f), f


@pytest.mark.parametrize("seed", range(20))
def test_reader_matches_protobuf(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 50))
    req = pb.StreamFramesRequest()
    kw = {}
    if rng.random() < 0.8:
        kw.update(add_ids=rng.integers(0, 2**63, n), add_boxes=rng.random((n, 4)),
                  add_category=rng.integers(0, 2**32, n), add_static=rng.random(n) < 0.5)
    if rng.random() < 0.5:
        kw.update(update_ids=rng.integers(0, 2**63, n), update_boxes=rng.random((n, 6)), remove_ids=[1, 2])
    encode_frame("w" * int(rng.integers(0, 80)), int(rng.integers(0, 2**64, dtype=np.uint64)), **kw, into=req.frame)
    raw = req.SerializeToString()
    view = read_frame(raw)
    assert isinstance(view, FrameView)
    _same(view, pb.StreamFramesRequest.FromString(raw).frame)
    unary = pb.ApplyFrameRequest(frame=req.frame).SerializeToString()
    _same(read_frame(unary), req.frame)


def test_repeated_fields_fall_back_to_protobuf_semantics():
    a = pb.StreamFramesRequest(frame=frame_pb2.Frame(world="a", seq=1, add_ids=b"\x01" * 8))
    b = pb.StreamFramesRequest(frame=frame_pb2.Frame(seq=2, remove_ids=b"\x02" * 8))
    raw = a.SerializeToString() + b.SerializeToString()        # protobuf merges the two frames
    got = read_frame(raw)
    want = pb.StreamFramesRequest.FromString(raw).frame
    assert isinstance(got, frame_pb2.Frame) and got == want and got.world == "a" and got.seq == 2


def test_unknown_fields_are_skipped():
    frame = frame_pb2.Frame(world="w", seq=3, add_ids=b"\x05" * 8)
    raw = frame.SerializeToString() + varint_field(99, 7) + wrap(100, b"junk")
    view = read_frame(wrap(1, raw) + varint_field(5, 1))
    assert view.world == "w" and view.seq == 3 and bytes(view.add_ids) == b"\x05" * 8


def test_wrap_makes_valid_responses():
    d = frame_pb2.Delta(seq=9, created=np.arange(4, dtype="<u8").tobytes())
    resp = pb.StreamFramesResponse.FromString(varint_field(1, 9) + wrap(2, d.SerializeToString()))
    assert resp.seq == 9 and resp.delta == d
    assert pb.ApplyFrameResponse.FromString(wrap(1, d.SerializeToString())).delta == d


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 2**64 - 1),
                st.sampled_from([0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**64 - 1])),
       st.integers(0, 2**64 - 1))
def test_seq_and_lengths_are_framed_as_protobuf_frames_them(seq, value):
    # the framer's varints (one, two and three bytes without a loop, longer ones in it) are protobuf's
    d = frame_pb2.Delta(seq=seq, frame=value, world="w" * (value % 20000))
    raw = d.SerializeToString()
    resp = varint_field(1, seq) + wrap(2, raw)
    assert resp == pb.StreamFramesResponse(seq=seq, delta=d).SerializeToString()
    assert pb.StreamFramesResponse.FromString(resp).delta == d


@pytest.mark.parametrize("garbage", [b"\xff", b"\x0a\x05ab", b"\x0a\x02\x0a\xff"])
def test_malformed_request_bytes_are_invalid_argument(server, garbage):
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary("/sapgrid.v1.SapgridService/ApplyFrame")
        with pytest.raises(grpc.RpcError) as ei:
            call(garbage, timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frame" in ei.value.details()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b, value = value & 0x7F, value >> 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


_PIECES = st.one_of(
    st.binary(max_size=12),                                            # random bytes
    st.builds(lambda v: b"\x10" + _varint(v), st.integers(0, 2**80)),  # seq, also past 64 bits
    st.just(b"\x10" + b"\xff" * 9 + b"\x7f"),                        # a 10-byte seq over 2**64
    st.just(b"\x10" + b"\xff" * 10 + b"\x01"),                       # an 11-byte varint (corrupt)
    st.builds(lambda n: _varint(n << 3 | 2) + b"\x01x", st.integers(0, 2**32)),   # any field number
    st.just(b"\x00\x01"), st.just(b"\x02\x00"),                       # field number 0
    st.builds(lambda f, b: _varint(f << 3 | 2) + _varint(len(b)) + b, st.sampled_from([1, 3, 4, 5, 9, 10, 11]),
              st.binary(max_size=24)),                                # bytes fields, world
    st.builds(lambda wt: bytes([0x18 | wt]), st.integers(0, 7)),       # every wire type
)


@settings(max_examples=600, deadline=None, derandomize=True, database=None)
@given(inner=st.lists(_PIECES, max_size=5).map(b"".join), wrapped=st.booleans())
def test_the_reader_refuses_and_reads_exactly_what_protobuf_does(inner, wrapped):
    """Whatever parses the wire refuses exactly what protobuf refuses, and reads what it reads."""
    raw = (b"\x0a" + _varint(len(inner)) + inner) if wrapped else inner
    try:
        want = pb.StreamFramesRequest.FromString(raw).frame
    except DecodeError:
        want = None
    try:
        got = read_frame(raw)
    except InvalidInput:
        got = None
    assert (got is None) == (want is None)
    if want is not None:
        _same(got, want)
        assert got.seq < 2**64


def test_hostile_frames_over_the_wire_change_nothing_or_follow_protobuf(server, client, world_name):
    """A frame holding field number 0 is refused INVALID_ARGUMENT and applies nothing; a 10-byte seq
    past 2**64 is read as protobuf reads it (its low 64 bits), applied once and answered."""
    client.create_world(world_name, dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
    apply = grpc.insecure_channel(server.address).unary_unary(
        "/sapgrid.v1.SapgridService/ApplyFrame", request_serializer=None, response_deserializer=None)
    frame = encode_frame(world_name, 0, add_ids=[1, 2], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]]).SerializeToString()
    for inner in (frame + b"\x00\x01", b"\x02\x00" + frame):
        with pytest.raises(grpc.RpcError) as ei:
            apply(b"\x0a" + _varint(len(inner)) + inner, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = client.get_world(world_name)
    assert info.objects == 0 and info.frames == 0
    inner = frame + b"\x10" + b"\xff" * 9 + b"\x7f"
    delta = pb.ApplyFrameResponse.FromString(apply(b"\x0a" + _varint(len(inner)) + inner, timeout=30)).delta
    assert delta.seq == 2**64 - 1 and np.frombuffer(delta.created, "<u8").tolist() == [1, 2]
    assert client.get_world(world_name).frames == 1


def test_the_echo_service_is_off_by_default_and_bounded_when_on(server, make_server):
    from sapgrid.v1 import echo_service_pb2 as echo_pb, echo_service_pb2_grpc as echo_grpc

    with grpc.insecure_channel(server.address) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            echo_grpc.EchoServiceStub(ch).Echo(echo_pb.EchoRequest(payload=b"x"), timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
    srv = make_server(echo=True, max_message_bytes=1 << 20)
    with grpc.insecure_channel(srv.address) as ch:
        stub = echo_grpc.EchoServiceStub(ch)
        assert stub.Echo(echo_pb.EchoRequest(payload=b"abc"), timeout=10).payload == b"abc"
        assert len(stub.Echo(echo_pb.EchoRequest(reply_bytes=1000), timeout=10).payload) == 1000
        for ask in (2**20 + 1, 2**30, 2**32 - 1):
            with pytest.raises(grpc.RpcError) as ei:
                stub.Echo(echo_pb.EchoRequest(reply_bytes=ask), timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "reply_bytes" in ei.value.details()
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.EchoStream(iter([echo_pb.EchoStreamRequest(reply_bytes=2**31)]), timeout=10))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("method, streaming", [
    ("CreateWorld", False), ("DeleteWorld", False), ("ListWorlds", False), ("GetWorld", False),
    ("QueryRegion", False), ("ListPairs", False), ("StreamPairs", True), ("Subscribe", True)])
def test_undecodable_requests_to_every_other_method_are_invalid_argument(server, method, streaming):
    with grpc.insecure_channel(server.address) as ch:
        kind = ch.unary_stream if streaming else ch.unary_unary
        call = kind(f"/sapgrid.v1.SapgridService/{method}", request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as ei:
            r = call(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)           # a length far past the end
            list(r) if streaming else r
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
        assert "not a valid" in ei.value.details()
