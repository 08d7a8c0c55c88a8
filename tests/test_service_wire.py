"""The zero-copy frame reader agrees with protobuf; malformed request bytes are INVALID_ARGUMENT."""
from __future__ import annotations

import grpc
import numpy as np
import pytest

from sapgrid.client.codec import encode_frame
from sapgrid.server.protocol import FrameView, read_frame, varint_field, wrap
from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb

FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static", "update_ids",
          "update_boxes")


def _same(view, frame: frame_pb2.Frame):
    assert view.world == frame.world and view.seq == frame.seq
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


@pytest.mark.parametrize("garbage", [b"\xff", b"\x0a\x05ab", b"\x0a\x02\x0a\xff"])
def test_malformed_request_bytes_are_invalid_argument(server, garbage):
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_unary("/sapgrid.v1.SapgridService/ApplyFrame")
        with pytest.raises(grpc.RpcError) as ei:
            call(garbage, timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "frame" in ei.value.details()
