"""Property-based fuzzing of the raw wire: random and mutated messages to every RPC of the service.

A generic channel with identity serializers sends bytes as they are: random bytes, and valid requests
(frames with NaN/Inf/extreme floats, ids of every size, arrays of mismatched lengths, unicode and very
long names) whose bytes are then flipped, cut or spliced. After every call: the server is alive (its
health check answers), the status is one the contract documents, with a short clear message, and a
refused call left the world exactly as it was (its full pair list, objects and counters).
"""
from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings, strategies as st

from sapgrid.client import Client
from sapgrid.v1 import sapgrid_service_pb2 as pb
from sapgrid.v1 import frame_pb2

SERVICE = pb.DESCRIPTOR.services_by_name["SapgridService"]
METHODS = {m.name: m for m in SERVICE.methods}
WORLD = "fz"
#: Statuses the contract documents for client input (UNIMPLEMENTED: a method this server does not serve;
#: PERMISSION_DENIED: a role that does not cover the call, with --auth-file).
DOCUMENTED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
              grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
              grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED}
#: Calls that change which worlds exist: never pointed at the world under test.
ADMIN = {"DeleteWorld", "RestoreWorld", "FreezeWorld"}
MAX_MESSAGE = 1 << 20

names = st.one_of(st.sampled_from([WORLD, "fz3", "", "nope", "fz\x00", "ǝɯɐu", "a" * 65]),
                  st.text(max_size=40), st.text(min_size=5000, max_size=12000, alphabet="xyz☃"))
floats32 = st.one_of(st.floats(width=32), st.sampled_from([float("nan"), float("inf"), -float("inf"), 3.4e38,
                                                            -3.4e38, 1e-45, 0.0, -0.0]))
ids = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 12))


@st.composite
def frames(draw) -> bytes:
    """A Frame's bytes: arrays of random (often mismatched) sizes and hostile values."""
    n = draw(st.integers(0, 6))
    cols = draw(st.sampled_from([4, 4, 4, 6, 3, 0]))

    def id_bytes():
        return np.array(draw(st.lists(ids, min_size=0, max_size=n + 1)), dtype=np.uint64).tobytes()

    def box_bytes():
        rows = draw(st.integers(0, n + 1))
        values = draw(st.lists(floats32, min_size=rows * cols, max_size=rows * cols))
        if draw(st.booleans()):                              # mostly valid boxes: mins <= maxs
            arr = np.array(values, dtype=np.float32).reshape(rows, cols) if cols else np.zeros((rows, 0), np.float32)
            if cols == 4:
                arr = np.concatenate([np.minimum(arr[:, :2], arr[:, 2:]), np.maximum(arr[:, :2], arr[:, 2:])], 1)
            return arr.astype(np.float32).tobytes()
        return struct.pack(f"<{len(values)}f", *values)

    frame = frame_pb2.Frame(world=draw(names), seq=draw(st.integers(0, 2**64 - 1)))
    for field in ("remove_ids", "add_ids", "update_ids"):
        if draw(st.booleans()):
            setattr(frame, field, id_bytes())
    for field in ("add_boxes", "update_boxes"):
        if draw(st.booleans()):
            setattr(frame, field, box_bytes())
    for field in ("add_category", "add_mask", "add_static"):
        if draw(st.integers(0, 3)) == 0:
            setattr(frame, field, draw(st.binary(max_size=40)))
    if draw(st.integers(0, 3)) == 0:
        frame.writer = draw(names)
    return frame.SerializeToString()


def _fill(draw, message, depth: int = 0) -> None:
    """Random values in every field of any request message (names from ``names``)."""
    for field in message.DESCRIPTOR.fields:
        if draw(st.integers(0, 3)) == 0:
            continue
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 2 and not repeated:
                if field.message_type.name == "Frame":
                    getattr(message, field.name).MergeFromString(draw(frames()))
                else:
                    _fill(draw, getattr(message, field.name), depth + 1)
            continue
        if field.type == FieldDescriptor.TYPE_STRING:
            value = st.just(WORLD) if field.name in ("world", "name") and draw(st.booleans()) else names
        elif field.type == FieldDescriptor.TYPE_BYTES:
            value = st.binary(max_size=200)
        elif field.type == FieldDescriptor.TYPE_BOOL:
            value = st.booleans()
        elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            value = st.one_of(st.floats(), floats32)
        elif field.type in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
            value = st.integers(0, 2**64 - 1)
        elif field.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
            value = st.integers(0, 2**32 - 1)
        elif field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
            value = st.integers(-2**63, 2**63 - 1)
        elif field.type == FieldDescriptor.TYPE_ENUM:
            value = st.sampled_from([v.number for v in field.enum_type.values])
        else:
            value = st.integers(-2**31, 2**31 - 1)
        if repeated:
            getattr(message, field.name).extend(draw(st.lists(value, max_size=8)))
        else:
            setattr(message, field.name, draw(value))


@st.composite
def payloads(draw, method) -> bytes:
    """One request's bytes: random, or valid then (maybe) mutated."""
    kind = draw(st.sampled_from(["random", "valid", "valid", "mutated", "mutated"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    request = message_factory.GetMessageClass(method.input_type)()
    _fill(draw, request)
    if method.name in ADMIN and getattr(request, "name", None) == WORLD:
        request.name = WORLD + "-other"
    data = bytearray(request.SerializeToString())
    if kind == "mutated" and data:
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "cut", "splice", "length"]))
            i = draw(st.integers(0, max(0, len(data) - 1)))
            if op == "flip" and data:
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif op == "cut":
                del data[i:]
            elif op == "splice":
                data[i:i] = draw(st.binary(min_size=1, max_size=20))
            elif op == "length" and data:                     # a varint length byte made huge or wrong
                data[i] = draw(st.sampled_from([0x7F, 0xFF, 0x00, 0x80]))
    return bytes(data)


calls = st.sampled_from(sorted(METHODS)).flatmap(
    lambda name: st.tuples(st.just(name), st.lists(payloads(METHODS[name]), min_size=1,
                                                   max_size=3 if METHODS[name].client_streaming else 1)))


@pytest.fixture(scope="module", params=["open", "auth"])
def target(request, tmp_path_factory):
    """A server with two worlds, without auth, or with an auth file (the fuzzer then calls with a reader
    token: every write is refused, and must change nothing)."""
    from conftest import ServerThread
    from security_helpers import auth_file

    extra, tokens = {}, {}
    if request.param == "auth":
        path = tmp_path_factory.mktemp("fuzz") / "auth.toml"
        tokens = auth_file(path, {"ops": ("admin", "*"), "look": ("reader", "*")})
        extra = dict(auth_file=str(path))
    srv = ServerThread(default_world="", max_message_bytes=MAX_MESSAGE, queue_size=8, max_worlds=64,
                       max_world_bytes=64 << 20, **extra)
    with Client(srv.address, token=tokens.get("ops")) as c:
        c.create_world(WORLD, dims=2, bounds=(0, 0, 100, 100), cells=(4, 4))
        c.create_world("fz3", dims=3, bounds=(0, 0, 0, 100, 100, 100), cells=(2, 2, 2))
        rng = np.random.default_rng(7)
        lo = rng.uniform(0, 95, (40, 2))
        c.step(WORLD, 1, add_ids=np.arange(1, 41, dtype=np.uint64),
               add_boxes=np.concatenate([lo, lo + rng.uniform(0.5, 5, (40, 2))], 1).astype(np.float32))
    channel = grpc.insecure_channel(srv.address, options=[("grpc.max_send_message_length", 64 << 20)])
    if tokens:
        from sapgrid.client._channel import _TokenInterceptor

        channel = grpc.intercept_channel(channel, _TokenInterceptor((("authorization", f"Bearer {tokens['look']}"),)))
    yield srv, channel
    channel.close()
    srv.stop()


def _state(srv):
    r = srv.app.registry.get(WORLD)
    return r.world.pairs().tolist(), r.world.query(np.array([-1e9, -1e9, 1e9, 1e9], np.float32)).tolist(), \
        r.objects, r.pairs, r.frames, r.generation


def _check_status(code, details, method):
    assert code in DOCUMENTED or (code == grpc.StatusCode.DEADLINE_EXCEEDED and method == "Subscribe"), \
        f"{method}: undocumented status {code} {details!r}"
    if code != grpc.StatusCode.OK:
        assert details and len(details) < 2000, f"{method}: {code} message {details[:200]!r}... ({len(details)})"


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(call=calls)
def test_hostile_bytes_to_every_rpc(target, call):
    srv, channel = target
    name, messages = call
    method = METHODS[name]
    path = f"/{SERVICE.full_name}/{name}"
    before = _state(srv)
    refused = accepted = False
    timeout = 2.0 if name == "Subscribe" else 60.0
    try:
        if method.client_streaming and method.server_streaming:
            for raw in channel.stream_stream(path)(iter(messages), timeout=timeout):
                answer = pb.StreamFramesResponse.FromString(raw)
                if answer.HasField("error"):                    # a frame refused in its own slot
                    refused = True
                    code = next(c for c in grpc.StatusCode if c.value[0] == answer.error.code)
                    assert code != grpc.StatusCode.OK
                    _check_status(code, answer.error.message, name)
                else:
                    accepted = True
        elif method.client_streaming:
            channel.stream_unary(path)(iter(messages), timeout=timeout)
        elif method.server_streaming:
            for _ in channel.unary_stream(path)(messages[0], timeout=timeout):
                pass
        else:
            channel.unary_unary(path)(messages[0], timeout=timeout)
    except grpc.RpcError as err:
        _check_status(err.code(), err.details(), name)
        refused = err.code() != grpc.StatusCode.DEADLINE_EXCEEDED
    if refused and not accepted:
        assert _state(srv) == before, f"{name}: a refused call changed the world"
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_the_fuzzed_world_is_still_consistent(target):
    srv, _ = target
    r = srv.app.registry.get(WORLD)
    r.world.validate()
