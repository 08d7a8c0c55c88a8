"""Exactly-once frames (Frame.writer + seq), the pair digest, FreezeWorld, SnapshotWorld / RestoreWorld,
over a real server on a loopback port (raw sapgrid.v1 stubs, so every field of the contract is seen)."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from sapgrid.client.codec import encode_frame
from sapgrid.layout import config_message, pairs_digest
from sapgrid.server import snapshot
from sapgrid.server.errors import InvalidInput
from sapgrid.server.protocol import read_frame
from sapgrid.server.writers import Writers
from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from naive import brute_force_pairs, pairs_to_array
from service_helpers import random_boxes


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        yield pb_grpc.SapgridServiceStub(ch)


def create(stub, name, dims=2, side=100.0, cells=None):
    bounds = (0.0,) * dims + (side,) * dims
    stub.CreateWorld(pb.CreateWorldRequest(name=name, config=config_message(dims=dims, bounds=bounds,
                                                                            cells=cells or (4,) * dims)))


def frame(world, seq, writer="", **arrays):
    req = pb.ApplyFrameRequest()
    encode_frame(world, seq, **arrays, into=req.frame)
    req.frame.writer = writer
    return req


def apply(stub, world, seq, writer="", **arrays):
    return stub.ApplyFrame(frame(world, seq, writer, **arrays), timeout=120).delta


def info(stub, name):
    return stub.GetWorld(pb.GetWorldRequest(name=name), timeout=120).world


def all_pairs(stub, name) -> np.ndarray:
    chunks = [np.frombuffer(r.pairs, "<u8") for r in stub.StreamPairs(pb.StreamPairsRequest(world=name), timeout=120)]
    return np.concatenate(chunks).reshape(-1, 2) if chunks else np.empty((0, 2), np.uint64)


def code_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    return ei.value.code(), ei.value.details()


# ---- writers -------------------------------------------------------------------------------------

def test_a_writers_duplicate_is_answered_with_its_first_delta_and_never_applied_again(stub, world_name):
    create(stub, world_name)
    rng = np.random.default_rng(1)
    boxes = random_boxes(rng, 40)
    first = apply(stub, world_name, 5, "m1", add_ids=np.arange(40), add_boxes=boxes)   # a new writer: any seq >= 1
    second = apply(stub, world_name, 6, "m1", update_ids=[0, 1], update_boxes=boxes[[5, 6]])
    assert info(stub, world_name).stats.writers == {"m1": 6}
    again = apply(stub, world_name, 5, "m1", add_ids=np.arange(40), add_boxes=boxes)
    assert again.SerializeToString() == first.SerializeToString()           # the very same answer
    # the duplicate's body is not even looked at: only (writer, seq) decide
    assert apply(stub, world_name, 6, "m1").SerializeToString() == second.SerializeToString()
    st = info(stub, world_name).stats
    assert st.frames == 2 and st.objects == 40 and st.writers == {"m1": 6}
    assert st.pairs_digest == second.pairs_digest == pairs_digest(all_pairs(stub, world_name))


def test_gaps_old_seqs_and_bad_writers_are_refused_naming_the_numbers(stub, world_name):
    create(stub, world_name)
    apply(stub, world_name, 7, "m1", add_ids=[1], add_boxes=[[0, 0, 1, 1]])
    code, msg = code_of(lambda: apply(stub, world_name, 10, "m1", add_ids=[2], add_boxes=[[0, 0, 1, 1]]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "expected seq 8" in msg and "10" in msg
    for bad in ("a b", "x" * 65, "é"):
        code, msg = code_of(lambda: apply(stub, world_name, 8, bad, add_ids=[2], add_boxes=[[0, 0, 1, 1]]))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "writer" in msg
    code, msg = code_of(lambda: apply(stub, world_name, 0, "m2", add_ids=[2], add_boxes=[[0, 0, 1, 1]]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "seq" in msg
    st = info(stub, world_name).stats
    assert st.frames == 1 and st.objects == 1 and st.writers == {"m1": 7} and st.frames_rejected == 5
    # a refused frame does not move the writer: the next seq is still 8; an engine refusal neither
    code, _ = code_of(lambda: apply(stub, world_name, 8, "m1", add_ids=[1], add_boxes=[[0, 0, 1, 1]]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    apply(stub, world_name, 8, "m1", add_ids=[2], add_boxes=[[0, 0, 1, 1]])
    assert info(stub, world_name).stats.writers == {"m1": 8}
    # frames without a writer are not deduplicated, as before
    apply(stub, world_name, 8, update_ids=[2], update_boxes=[[0, 0, 2, 2]])
    apply(stub, world_name, 8, update_ids=[2], update_boxes=[[0, 0, 3, 3]])
    assert info(stub, world_name).stats.frames == 4


def test_answers_older_than_the_kept_ones_are_failed_precondition():
    w = Writers(keep=256)
    for seq in range(1, 901):
        assert w.answer("m1", seq) is None
        w.record("m1", seq, seq.to_bytes(8, "little"))
    assert w.answer("m1", 900 - 255) == (900 - 255).to_bytes(8, "little")
    with pytest.raises(Exception) as ei:
        w.answer("m1", 5)
    assert "seq 5" in str(ei.value) and "last applied seq is 900" in str(ei.value)
    small = Writers(keep=256, byte_limit=100)
    for seq in range(1, 50):
        small.record("w", seq, bytes(30))
    assert small.answer("w", 49) == bytes(30) and small.answer("w", 47) == bytes(30)
    with pytest.raises(Exception):
        small.answer("w", 46)                     # beyond the byte bound


def test_two_streams_of_one_writer_never_apply_a_seq_twice(stub, world_name):
    create(stub, world_name)
    apply(stub, world_name, 1, "m1", add_ids=[1], add_boxes=[[0, 0, 1, 1]])
    answers: dict[int, list] = {}
    errors = []

    def send():
        requests = (pb.StreamFramesRequest(frame=frame(world_name, s, "m1", update_ids=[1],
                                                       update_boxes=[[s, 0, s + 1, 1]]).frame)
                    for s in range(2, 42))
        for r in stub.StreamFrames(requests, timeout=120):
            if r.HasField("error"):
                errors.append(r.error.code)
            else:
                answers.setdefault(r.seq, []).append(r.delta.SerializeToString())

    threads = [threading.Thread(target=send) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    st = info(stub, world_name).stats
    assert st.frames == 41 and st.writers == {"m1": 41}
    assert all(len(set(v)) == 1 for v in answers.values())          # every answer of a seq is the same
    assert set(errors) <= {grpc.StatusCode.FAILED_PRECONDITION.value[0]}


def _piece(writer: bytes) -> bytes:
    return bytes([0x5A, len(writer)]) + writer


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(writer=st.one_of(st.binary(max_size=20), st.text(max_size=20).map(str.encode)), twice=st.booleans())
def test_the_fast_reader_reads_the_writer_as_protobuf_does(writer, twice):
    inner = _piece(writer) + (_piece(b"zz") if twice else b"") + b"\x10\x05"
    raw = b"\x0a" + bytes([len(inner)]) + inner
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
        assert got.writer == want.writer and got.seq == want.seq == 5


# ---- digest and freeze ---------------------------------------------------------------------------

def test_every_delta_carries_the_digest_of_the_active_pairs(stub, world_name):
    create(stub, world_name, side=50.0)
    rng = np.random.default_rng(3)
    boxes = random_boxes(rng, 300, side=50.0)
    d = apply(stub, world_name, 1, add_ids=np.arange(300), add_boxes=boxes)
    assert d.pairs_digest == pairs_digest(all_pairs(stub, world_name)) != 0
    for seq in range(2, 12):
        moved = rng.choice(np.arange(20, 300), 60, replace=False)      # ids 2..11 are removed, one a frame
        boxes[moved] = random_boxes(rng, 60, side=50.0)
        d = apply(stub, world_name, seq, update_ids=moved, update_boxes=boxes[moved], remove_ids=[seq])
        assert d.pairs_digest == pairs_digest(all_pairs(stub, world_name))
    assert info(stub, world_name).stats.pairs_digest == d.pairs_digest


def test_a_frozen_world_refuses_frames_moving_and_serves_reads(stub, world_name):
    create(stub, world_name)
    apply(stub, world_name, 1, "m1", add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
    w = stub.FreezeWorld(pb.FreezeWorldRequest(name=world_name, frozen=True), timeout=120).world
    assert w.stats.frozen
    code, msg = code_of(lambda: apply(stub, world_name, 2, "m1", remove_ids=[1]))
    assert code == grpc.StatusCode.UNAVAILABLE and "moving" in msg
    code, msg = code_of(lambda: apply(stub, world_name, 2, remove_ids=[1]))
    assert code == grpc.StatusCode.UNAVAILABLE and "moving" in msg
    assert apply(stub, world_name, 1, "m1").frame == 1                   # a duplicate is a read: answered
    assert all_pairs(stub, world_name).tolist() == [[1, 2]]
    assert sum(1 for _ in stub.SnapshotWorld(pb.SnapshotWorldRequest(name=world_name), timeout=120)) >= 1
    st = info(stub, world_name).stats
    assert st.frozen and st.frames == 1 and st.objects == 2
    assert not stub.FreezeWorld(pb.FreezeWorldRequest(name=world_name), timeout=120).world.stats.frozen
    assert apply(stub, world_name, 2, "m1", remove_ids=[1]).frame == 2
    code, _ = code_of(lambda: stub.FreezeWorld(pb.FreezeWorldRequest(name=world_name + "-none", frozen=True)))
    assert code == grpc.StatusCode.NOT_FOUND


# ---- snapshot / restore --------------------------------------------------------------------------

def take(stub, name) -> tuple[bytes, int]:
    chunks = list(stub.SnapshotWorld(pb.SnapshotWorldRequest(name=name), timeout=120))
    data = b"".join(c.chunk for c in chunks)
    assert all(c.total_bytes == len(data) for c in chunks)
    return data, chunks[0].frame


def restore(stub, data: bytes, name: str = "", chunk: int = 1000):
    reqs = [pb.RestoreWorldRequest(name=name if i == 0 else "", chunk=data[i:i + chunk])
            for i in range(0, max(len(data), 1), chunk)]
    return stub.RestoreWorld(iter(reqs), timeout=120).world


def _scene(rng, n, dims):
    boxes = random_boxes(rng, n, dims=dims, side=60.0)
    cat = rng.integers(1, 8, n).astype(np.uint32)
    mask = rng.integers(1, 8, n).astype(np.uint32)
    static = rng.random(n) < 0.3
    return boxes, cat, mask, static


@pytest.mark.parametrize("dims", [2, 3])
def test_a_restored_world_continues_exactly_like_the_original(stub, world_name, dims):
    create(stub, world_name, dims=dims, side=60.0)
    rng = np.random.default_rng(dims)
    n = 400
    ids = np.arange(10, 10 + n, dtype=np.uint64)
    boxes, cat, mask, static = _scene(rng, n, dims)
    apply(stub, world_name, 1, "w1", add_ids=ids, add_boxes=boxes, add_category=cat, add_mask=mask,
          add_static=static)
    for seq in range(2, 6):
        moved = rng.choice(n, 50, replace=False)
        boxes[moved] = random_boxes(rng, 50, dims=dims, side=60.0)
        apply(stub, world_name, seq, "w1", update_ids=ids[moved], update_boxes=boxes[moved])
    data, at = take(stub, world_name)
    assert at == 5
    copy = world_name + "-copy"
    w = restore(stub, data, copy)
    orig = info(stub, world_name)
    assert w.name == copy and w.stats.frames == 5 and w.stats.objects == n and w.stats.writers == {"w1": 5}
    assert w.stats.pairs_digest == orig.stats.pairs_digest and w.stats.pairs == orig.stats.pairs
    assert w.config.bounds == orig.config.bounds and list(w.config.cells) == list(orig.config.cells)
    assert np.array_equal(all_pairs(stub, copy), all_pairs(stub, world_name))
    want = brute_force_pairs(ids, boxes, cat, mask, static)
    assert np.array_equal(all_pairs(stub, copy), pairs_to_array(want))
    # a duplicate of the original's last frame gets the original's answer from the copy too
    assert apply(stub, copy, 5, "w1").created == apply(stub, world_name, 5, "w1").created
    for seq in range(6, 12):
        moved = rng.choice(n, 80, replace=False)
        boxes[moved] = random_boxes(rng, 80, dims=dims, side=60.0)
        kw = dict(update_ids=ids[moved], update_boxes=boxes[moved])
        a = apply(stub, world_name, seq, "w1", **kw)
        b = apply(stub, copy, seq, "w1", **kw)
        assert (a.created, a.deleted, a.frame, a.pairs_digest) == (b.created, b.deleted, b.frame, b.pairs_digest)
    # under its own name: ALREADY_EXISTS while the original lives; after deleting it, restored as itself
    code, _ = code_of(lambda: restore(stub, data))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    stub.DeleteWorld(pb.DeleteWorldRequest(name=world_name), timeout=120)
    assert restore(stub, data).name == world_name


def test_a_bad_snapshot_is_invalid_argument_and_creates_nothing(stub, world_name):
    create(stub, world_name)
    apply(stub, world_name, 1, add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
    data, _ = take(stub, world_name)
    damaged = bytearray(data)
    damaged[-3] ^= 0xFF
    name = world_name + "-bad"
    for bad in (bytes(damaged), data[:-1], data + b"x", b"NOTASNAPSHOT" * 3, b""):
        code, msg = code_of(lambda: restore(stub, bad, name))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "snapshot" in msg, msg
    # a well-formed snapshot whose objects do not give its digest
    state = snapshot.decode(data)
    state.digest ^= 1
    code, msg = code_of(lambda: restore(stub, snapshot.encode(state), name))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "digest" in msg
    code, _ = code_of(lambda: restore(stub, data, "bad name!"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    names = [w.name for w in stub.ListWorlds(pb.ListWorldsRequest(), timeout=120).worlds]
    assert name not in names and "bad name!" not in names


def test_world_export_is_every_live_object_as_ids_boxes_and_filters_say():
    from sapcore import World, WorldConfig

    w = World(WorldConfig(dims=3, bounds=(0, 0, 0, 50, 50, 50), cells=(3, 3, 3)))
    rng = np.random.default_rng(4)
    boxes, cat, mask, static = _scene(rng, 200, 3)
    w.step(add_ids=np.arange(200) * 7, add_boxes=boxes, add_category=cat, add_mask=mask, add_static=static)
    w.step(remove_ids=np.arange(0, 200, 3) * 7)
    ids, bx, c, m, s = w.export()
    order = np.argsort(ids)
    want = w.ids()
    assert np.array_equal(ids[order], want) and np.array_equal(bx[order], w.boxes(want))
    for got, exp in zip((c, m, s), w.filters(want)):
        assert np.array_equal(got[order], exp)
    bx[:] = 0                                               # copies: the world is untouched
    assert np.array_equal(w.boxes(want), boxes[(want // 7).astype(np.int64)])


def test_a_snapshot_larger_than_the_world_budget_is_refused_before_it_is_read(make_server, world_name):
    s = make_server(max_world_bytes=2 << 20, default_world="")
    with grpc.insecure_channel(s.address) as ch:
        stub = pb_grpc.SapgridServiceStub(ch)
        create(stub, world_name)
        state = snapshot.decode(take(stub, world_name)[0])
        n = 80_000                                   # ~2.6 MB of objects
        state.ids = np.arange(n, dtype=np.uint64)
        state.boxes = np.tile(np.array([[0, 0, 1, 1]], np.float32), (n, 1))
        state.category = state.mask = np.full(n, 1, np.uint32)
        state.static = np.zeros(n, bool)
        code, msg = code_of(lambda: restore(stub, snapshot.encode(state), world_name + "-big", chunk=1 << 16))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "budget" in msg


def test_a_snapshot_taken_while_frames_stream_is_between_two_of_them(stub, world_name):
    """Frames stream from another thread while the snapshot is taken; the snapshot is exactly the world
    after its frame N: the copy, given the frames after N, ends equal to the original."""
    create(stub, world_name, side=60.0)
    rng = np.random.default_rng(21)
    n = 300
    boxes = random_boxes(rng, n, side=60.0)
    apply(stub, world_name, 1, "w", add_ids=np.arange(n), add_boxes=boxes)
    moves = []
    for _ in range(60):
        moved = rng.choice(n, 40, replace=False)
        moves.append(dict(update_ids=moved, update_boxes=random_boxes(rng, 40, side=60.0)))
    started = threading.Event()

    def stream():
        reqs = (pb.StreamFramesRequest(frame=frame(world_name, k + 2, "w", **m).frame) for k, m in enumerate(moves))
        for i, r in enumerate(stub.StreamFrames(reqs, timeout=120)):
            assert not r.HasField("error")
            if i == 5:
                started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(120)
    data, at = take(stub, world_name)
    t.join(120)
    copy = world_name + "-c"
    w = restore(stub, data, copy)
    assert w.stats.frames == at and w.stats.writers == {"w": at}
    for seq in range(at + 1, len(moves) + 2):
        apply(stub, copy, seq, "w", **moves[seq - 2])
    a, b = info(stub, world_name).stats, info(stub, copy).stats
    assert (a.frames, a.pairs_digest, dict(a.writers)) == (b.frames, b.pairs_digest, dict(b.writers))
    assert np.array_equal(all_pairs(stub, world_name), all_pairs(stub, copy))


def test_restore_under_the_snapshots_own_name_needs_the_admin_role_on_that_name(make_server, tmp_path):
    from sapgrid.client import Client
    from sapgrid.client.errors import PermissionDenied

    from security_helpers import auth_file

    path = tmp_path / "auth.toml"
    tokens = auth_file(path, {"ops": ("admin", "*"), "mover": ("admin", "match-*")})
    s = make_server(auth_file=str(path), default_world="")
    with Client(s.address, token=tokens["ops"]) as ops, Client(s.address, token=tokens["mover"]) as mover:
        ops.create_world("lobby", dims=2, bounds=(0, 0, 10, 10), cells=(2, 2))
        data = ops.snapshot("lobby")
        ops.delete_world("lobby")
        with pytest.raises(PermissionDenied):
            mover.restore(data)                         # the snapshot's own name, "lobby": not the mover's
        assert "lobby" not in [w.name for w in ops.list_worlds()]
        assert mover.restore(data, name="match-7").name == "match-7"
        assert ops.restore(data).name == "lobby"
