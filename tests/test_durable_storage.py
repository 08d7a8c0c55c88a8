"""Durable worlds: the write-ahead log, snapshots by size, recovery (torn and damaged records, many
worlds), injected write failures, deletion, and kill -9 of a real `sapgrid serve --data-dir` process."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sapgrid.layout import pairs_digest
from sapgrid.server import storage as storage_mod
from sapgrid.v1 import sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc

from conftest import ServerThread
from sapgrid.server.app import build_server
from sapgrid.server.config import from_args
from naive import brute_force_pairs, pairs_to_array
from service_helpers import metric_value, random_boxes, scrape
from test_durable_frames import all_pairs, apply, code_of, create, frame, info


class Scene:
    """A moving 2D scene and its oracle: ids 0..n-1, boxes, filters; frames as keyword arrays."""

    def __init__(self, seed: int, n: int = 300, side: float = 80.0):
        self.rng = np.random.default_rng(seed)
        self.n, self.side = n, side
        self.ids = np.arange(n, dtype=np.uint64)
        self.boxes = random_boxes(self.rng, n, side=side)
        self.cat = self.rng.integers(1, 4, n).astype(np.uint32)
        self.mask = self.rng.integers(1, 4, n).astype(np.uint32)
        self.static = self.rng.random(n) < 0.2

    def first(self) -> dict:
        return dict(add_ids=self.ids, add_boxes=self.boxes, add_category=self.cat, add_mask=self.mask,
                    add_static=self.static)

    def move(self, k: int = 40) -> dict:
        moved = self.rng.choice(self.n, k, replace=False)
        self.boxes[moved] = random_boxes(self.rng, k, side=self.side)
        return dict(update_ids=self.ids[moved], update_boxes=self.boxes[moved].copy())

    def oracle(self) -> np.ndarray:
        return pairs_to_array(brute_force_pairs(self.ids, self.boxes, self.cat, self.mask, self.static))


@pytest.fixture
def stubs():
    channels = []

    def make(address):
        ch = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
        channels.append(ch)
        return pb_grpc.SapgridServiceStub(ch)

    yield make
    for ch in channels:
        ch.close()


def durable(tmp_path, **kw):
    kw.setdefault("default_world", "")
    return ServerThread(data_dir=str(tmp_path / "data"), **kw)


def world_files(tmp_path, name):
    return sorted(os.listdir(tmp_path / "data" / "worlds" / f"w-{name}"))


def check_world(stub, name, scene: Scene, frames: int, writers: dict):
    st = info(stub, name).stats
    pairs = all_pairs(stub, name)
    assert np.array_equal(pairs, scene.oracle())
    assert st.frames == frames and dict(st.writers) == writers and st.objects == scene.n
    assert st.pairs_digest == pairs_digest(pairs)


def test_worlds_come_back_after_a_restart_with_their_pairs_frames_writers_and_digest(tmp_path, stubs):
    s = durable(tmp_path)
    stub = stubs(s.address)
    scenes = {}
    for k, dims in enumerate((2, 2)):
        name = f"w{k}"
        create(stub, name, side=80.0)
        scenes[name] = sc = Scene(k)
        apply(stub, name, 1, "m1", **sc.first())
        for seq in range(2, 21):
            last = apply(stub, name, seq, "m1", **sc.move())
    s.stop()
    s = durable(tmp_path)
    stub = stubs(s.address)
    assert sorted(s.app.recovered.worlds) == ["w0", "w1"] and not s.app.recovered.failed
    for name, sc in scenes.items():
        check_world(stub, name, sc, 20, {"m1": 20})
    # the last answer is kept across the restart: the very same bytes
    assert apply(stub, "w1", 20, "m1").SerializeToString() == last.SerializeToString()
    code, msg = code_of(lambda: apply(stub, "w1", 22, "m1", **scenes["w1"].move()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "expected seq 21" in msg
    s.stop()


def _open_logs() -> int:
    """Descriptors of this process open on log files."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").endswith(".wal")
        except OSError:
            pass
    return n


@pytest.mark.parametrize("fsync", ["everysec", "no"])
def test_snapshots_cut_the_log_and_recovery_reads_the_newest(tmp_path, stubs, fsync):
    s = durable(tmp_path, snapshot_bytes=8192, fsync=fsync)
    stub = stubs(s.address)
    create(stub, "cut", side=80.0)
    sc = Scene(7)
    apply(stub, "cut", 1, "m1", **sc.first())
    for seq in range(2, 60):
        apply(stub, "cut", seq, "m1", **sc.move())
        if seq % 10 == 0:
            assert s.app.storage.wait_snapshots()
    assert s.app.storage.wait_snapshots()
    files = world_files(tmp_path, "cut")
    snaps = [f for f in files if f.startswith("snap-")]
    logs = [f for f in files if f.startswith("log-")]
    assert len(snaps) == 1 and 1 <= len(logs) <= 2 and int(snaps[0][5:25]) > 1      # cut, old files gone
    assert metric_value(scrape(s.metrics_url), "sapgrid_snapshots_total", outcome="ok") >= 2
    assert os.path.getsize(tmp_path / "data" / "worlds" / "w-cut" / logs[-1]) < 8192 * 3
    deadline = time.monotonic() + 10                 # a cut log's descriptor is closed (by the syncer within ~1 s)
    while _open_logs() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_logs() == 1
    s.stop()
    assert _open_logs() == 0
    s = durable(tmp_path, snapshot_bytes=8192)
    check_world(stubs(s.address), "cut", sc, 59, {"m1": 59})
    s.stop()


def _last_log(tmp_path, name):
    return tmp_path / "data" / "worlds" / f"w-{name}" / [f for f in world_files(tmp_path, name)
                                                        if f.startswith("log-")][-1]


def test_a_torn_last_record_is_dropped_and_the_world_recovered(tmp_path, stubs, caplog):
    s = durable(tmp_path)
    stub = stubs(s.address)
    create(stub, "torn", side=80.0)
    sc = Scene(3)
    apply(stub, "torn", 1, "m1", **sc.first())
    for seq in range(2, 8):
        apply(stub, "torn", seq, "m1", **sc.move())
    s.stop()
    path = _last_log(tmp_path, "torn")
    good = os.path.getsize(path)
    with open(path, "ab") as f:                # half of a record (a crash in the middle of a write)
        f.write(b"SGWR" + (5000).to_bytes(4, "little") + b"\x01\x02\x03\x04" + b"x" * 100)
    with caplog.at_level("WARNING", logger="sapgrid.server"):
        s = durable(tmp_path)
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert os.path.getsize(path) == good
    stub = stubs(s.address)
    check_world(stub, "torn", sc, 7, {"m1": 7})
    apply(stub, "torn", 8, "m1", **sc.move())                        # and it goes on
    s.stop()
    s = durable(tmp_path)
    check_world(stubs(s.address), "torn", sc, 8, {"m1": 8})
    s.stop()


def test_a_damaged_record_stops_that_worlds_recovery_and_the_others_are_served(tmp_path, stubs):
    s = durable(tmp_path)
    stub = stubs(s.address)
    scenes = {}
    for name in ("bad", "good"):
        create(stub, name, side=80.0)
        scenes[name] = sc = Scene(len(name))
        apply(stub, name, 1, "m1", **sc.first())
        for seq in range(2, 6):
            apply(stub, name, seq, "m1", **sc.move())
    s.stop()
    path = _last_log(tmp_path, "bad")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40                     # a bit flipped in the middle of the log
    path.write_bytes(bytes(data))
    s = durable(tmp_path)
    stub = stubs(s.address)
    assert s.app.recovered.worlds == ["good"]
    assert metric_value(scrape(s.metrics_url), "sapgrid_worlds_unrecovered") == 1
    msg = s.app.recovered.failed["bad"]
    assert str(path) in msg and "offset" in msg and "damaged" in msg
    code, _ = code_of(lambda: info(stub, "bad"))
    assert code == grpc.StatusCode.NOT_FOUND
    check_world(stub, "good", scenes["good"], 5, {"m1": 5})
    s.stop()
    assert path.read_bytes() == bytes(data)          # left as found, for whoever repairs it


class FailingOps(storage_mod.FileOps):
    """Writes and fsyncs fail with ENOSPC while ``full`` is set."""

    def __init__(self):
        self.full = False
        self.fail_truncate = False
        self.fail_fsync = False

    def datasync(self, fd):
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.fdatasync(fd)

    def pwritev(self, fd, bufs, offset):
        if self.full:
            # part of the record reaches the file before the disk fills up
            first = bytes(bufs[0])[:3]
            os.pwritev(fd, [first], offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.pwritev(fd, bufs, offset)

    def ftruncate(self, fd, n):
        if self.fail_truncate:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.ftruncate(fd, n)


@pytest.mark.parametrize("fail_truncate", [False, True])
def test_a_frame_whose_record_cannot_be_written_is_unavailable_and_changes_nothing(tmp_path, stubs,
                                                                                   fail_truncate):
    s = durable(tmp_path)
    ops = FailingOps()
    s.app.storage.io = ops
    stub = stubs(s.address)
    create(stub, "full", side=80.0)
    s.app.registry.get("full").log.io = ops
    sc = Scene(5)
    apply(stub, "full", 1, "m1", **sc.first())
    apply(stub, "full", 2, "m1", **sc.move())
    before = info(stub, "full").stats
    pairs = all_pairs(stub, "full")
    ops.full, ops.fail_truncate = True, fail_truncate
    saved = sc.boxes.copy()
    move = sc.move()
    for attempt in range(2):
        code, msg = code_of(lambda: apply(stub, "full", 3, "m1", **move))
        assert code == grpc.StatusCode.UNAVAILABLE and "log" in msg and "unchanged" in msg
        assert "No space left" in msg or (attempt and fail_truncate)
    after = info(stub, "full").stats
    assert (after.frames, after.objects, after.pairs_digest, dict(after.writers)) == \
           (before.frames, before.objects, before.pairs_digest, {"m1": 2})
    assert np.array_equal(all_pairs(stub, "full"), pairs)             # reads are served
    assert metric_value(scrape(s.metrics_url), "sapgrid_log_write_failures_total") == 2
    assert metric_value(scrape(s.metrics_url), "sapgrid_frames_total", world="full", outcome="unavailable") == 2
    ops.full = ops.fail_truncate = False                                # the disk has room again
    d = apply(stub, "full", 3, "m1", **move)
    assert d.frame == 3
    s.stop()
    s = durable(tmp_path)
    sc.boxes = saved
    sc.boxes[np.asarray(move["update_ids"], np.int64)] = move["update_boxes"]
    check_world(stubs(s.address), "full", sc, 3, {"m1": 3})            # only answered frames, nothing torn
    assert not s.app.recovered.failed
    s.stop()


def test_an_engine_refusal_leaves_no_record_and_creation_failure_creates_nothing(tmp_path, stubs):
    s = durable(tmp_path)
    stub = stubs(s.address)
    create(stub, "ref", side=80.0)
    apply(stub, "ref", 1, add_ids=[1], add_boxes=[[0, 0, 1, 1]])
    size = os.path.getsize(_last_log(tmp_path, "ref"))
    code, _ = code_of(lambda: apply(stub, "ref", 2, add_ids=[1], add_boxes=[[0, 0, 1, 1]]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert os.path.getsize(_last_log(tmp_path, "ref")) == size
    ops = FailingOps()
    ops.full = True
    s.app.storage.io = ops
    code, msg = code_of(lambda: create(stub, "nope"))
    assert code == grpc.StatusCode.UNAVAILABLE and "not created" in msg
    assert "nope" not in [w.name for w in stub.ListWorlds(pb.ListWorldsRequest(), timeout=60).worlds]
    assert not [e for e in os.listdir(tmp_path / "data" / "worlds") if "nope" in e]
    s.stop()


def test_deleting_a_world_deletes_its_files_and_restore_persists(tmp_path, stubs):
    s = durable(tmp_path)
    stub = stubs(s.address)
    create(stub, "gone", side=80.0)
    sc = Scene(9)
    apply(stub, "gone", 1, "m1", **sc.first())
    data = b"".join(c.chunk for c in stub.SnapshotWorld(pb.SnapshotWorldRequest(name="gone"), timeout=60))
    stub.DeleteWorld(pb.DeleteWorldRequest(name="gone"), timeout=60)
    assert os.listdir(tmp_path / "data" / "worlds") == []
    reqs = [pb.RestoreWorldRequest(name="back", chunk=data)]
    assert stub.RestoreWorld(iter(reqs), timeout=60).world.stats.frames == 1
    apply(stub, "back", 2, "m1", **sc.move())
    s.stop()
    s = durable(tmp_path)
    check_world(stubs(s.address), "back", sc, 2, {"m1": 2})
    s.stop()


@pytest.mark.parametrize("workers", [1, 3])
def test_recovery_of_many_worlds(tmp_path, stubs, monkeypatch, workers):
    monkeypatch.setattr(storage_mod, "RECOVERY_WORKERS", workers)
    s = durable(tmp_path, snapshot_bytes=16384)
    stub = stubs(s.address)
    scenes = {}
    for k in range(24):
        name = f"many{k:02d}"
        create(stub, name, side=80.0)
        scenes[name] = sc = Scene(100 + k, n=60)
        apply(stub, name, 1, f"w{k}", **sc.first())
        for seq in range(2, 2 + k % 5):
            apply(stub, name, seq, f"w{k}", **sc.move(10))
    s.stop()
    for f in world_files(tmp_path, "many07"):              # one world's snapshots damaged: only it fails
        if f.endswith(".snap"):
            with open(tmp_path / "data" / "worlds" / "w-many07" / f, "r+b") as fh:
                fh.seek(40)
                fh.write(b"\xff\xfe")
    s = durable(tmp_path, snapshot_bytes=16384)
    stub = stubs(s.address)
    assert len(s.app.recovered.worlds) == 23 and list(s.app.recovered.failed) == ["many07"]
    for k, (name, sc) in enumerate(scenes.items()):
        if name != "many07":
            check_world(stub, name, sc, 1 + k % 5, {f"w{k}": 1 + k % 5})
    code, _ = code_of(lambda: info(stub, "many07"))
    assert code == grpc.StatusCode.NOT_FOUND
    s.stop()


def test_health_is_not_serving_until_recovery_is_done(tmp_path, monkeypatch):
    gate, entered = threading.Event(), threading.Event()
    real = storage_mod.Storage.recover

    def slow(self, registry):
        entered.set()
        assert gate.wait(60)
        return real(self, registry)

    monkeypatch.setattr(storage_mod.Storage, "recover", slow)
    cfg = from_args(env={}, listen="127.0.0.1:0", metrics_port=-1, data_dir=str(tmp_path / "data"))
    app = build_server(cfg)
    t = threading.Thread(target=app.start)
    t.start()
    try:
        assert entered.wait(60)
        with grpc.insecure_channel(app.address) as ch:
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60)
            assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
            code, msg = code_of(lambda: pb_grpc.SapgridServiceStub(ch).GetWorld(pb.GetWorldRequest(name="default"),
                                                                                  timeout=60))
            assert code == grpc.StatusCode.UNAVAILABLE and "recovering" in msg
    finally:
        gate.set()
        t.join(60)
    try:
        with grpc.insecure_channel(app.address) as ch:
            assert health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=60).status == \
                   health_pb2.HealthCheckResponse.SERVING
            world = pb_grpc.SapgridServiceStub(ch).GetWorld(pb.GetWorldRequest(name="default"), timeout=60).world
            assert world.name == "default"                  # the default world is made after recovery
    finally:
        app.stop(2.0)


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path):
    s = durable(tmp_path)
    try:
        proc = subprocess.run([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port",
                               "-1", "--data-dir", str(tmp_path / "data")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 2 and "--data-dir" in proc.stderr and "in use" in proc.stderr
    finally:
        s.stop()


# ---- kill -9 of a real server process --------------------------------------------------------------

def _spawn(data_dir, *flags):
    proc = subprocess.Popen([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port", "-1",
                             "--default-world", "", "--data-dir", str(data_dir), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(200):
        line = proc.stdout.readline()
        if not line:
            break
        if "listening on " in line:
            return proc, line.split("listening on ", 1)[1].split()[0]
    proc.kill()
    proc.wait(30)
    raise AssertionError("the server did not start")


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_kill_9_loses_no_answered_frame(tmp_path, stubs, fsync):
    data = tmp_path / "data"
    proc, address = _spawn(data, "--fsync", fsync, "--snapshot-bytes", "65536")
    try:
        stub = stubs(address)
        create(stub, "k9", side=80.0)
        sc = Scene(11, n=400)
        apply(stub, "k9", 1, "m1", **sc.first())
        answered = 1
        sent, answers = [], {}

        def frames():
            nonlocal sent
            for seq in range(2, 200):
                kw = sc.move(30)
                sent.append(kw)
                yield pb.StreamFramesRequest(frame=frame("k9", seq, "m1", **kw).frame)

        stream = stub.StreamFrames(frames(), timeout=120)
        for r in stream:
            assert not r.HasField("error")
            answered = r.seq
            answers[r.seq] = r.delta.SerializeToString()
            if answered == 150:
                os.kill(proc.pid, signal.SIGKILL)           # mid-stream: frames in flight
                break
        stream.cancel()
    finally:
        proc.kill()
        proc.wait(30)
    proc, address = _spawn(data, "--fsync", fsync)
    try:
        stub = stubs(address)
        st = info(stub, "k9").stats
        # every answered frame is there; frames sent but not answered may be too (applied, answer lost)
        applied = st.frames
        assert answered <= applied <= 1 + len(sent) and dict(st.writers) == {"m1": applied}
        # the oracle of the applied frames: the first boxes, then the moves of seq 2..applied
        sc2 = Scene(11, n=400)
        for kw in sent[:applied - 1]:
            sc2.boxes[np.asarray(kw["update_ids"], np.int64)] = kw["update_boxes"]
        check_world(stub, "k9", sc2, applied, {"m1": applied})
        # an answer given before the kill is given again, byte for byte
        assert apply(stub, "k9", answered, "m1").SerializeToString() == answers[answered]
        # the client resends from its last answered seq: duplicates answered, then new frames applied
        for seq in range(answered + 1, applied + 1):
            assert apply(stub, "k9", seq, "m1", **sent[seq - 2]).frame == seq
        assert apply(stub, "k9", applied + 1, "m1", **sc2.move()).frame == applied + 1
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_name_of_a_world_that_could_not_be_recovered_is_not_reused_over_its_files(tmp_path, stubs):
    s = durable(tmp_path)
    stub = stubs(s.address)
    create(stub, "dmg", side=80.0)
    apply(stub, "dmg", 1, add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])
    s.stop()
    snap = [f for f in world_files(tmp_path, "dmg") if f.startswith("snap-")][0]
    (tmp_path / "data" / "worlds" / "w-dmg" / snap).write_bytes(b"garbage")
    s = durable(tmp_path)
    stub = stubs(s.address)
    assert "snapshot" in s.app.recovered.failed["dmg"]
    code, msg = code_of(lambda: create(stub, "dmg"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "could not be recovered" in msg
    assert snap in world_files(tmp_path, "dmg") and len(world_files(tmp_path, "dmg")) == 2     # left as found
    s.stop()


def test_fsync_always_answers_after_the_fsync_and_a_failed_fsync_is_unavailable(tmp_path, stubs):
    s = durable(tmp_path, fsync="always")
    ops = FailingOps()
    stub = stubs(s.address)
    create(stub, "fs", side=80.0)
    wlog = s.app.registry.get("fs").log
    s.app.storage.syncer.io = ops
    sc = Scene(12)
    d = apply(stub, "fs", 1, "m1", **sc.first())
    assert wlog.synced >= wlog.written and d.frame == 1          # answered once on disk
    ops.fail_fsync = True
    code, msg = code_of(lambda: apply(stub, "fs", 2, "m1", **sc.move()))
    assert code == grpc.StatusCode.UNAVAILABLE and "durable" in msg and "Input/output error" in msg
    assert metric_value(scrape(s.metrics_url), "sapgrid_fsync_failures_total") >= 1
    ops.fail_fsync = False
    # the frame was applied; the client sends it again (same writer and seq) and gets its answer once durable
    again = apply(stub, "fs", 2, "m1")
    assert again.frame == 2 and wlog.synced >= wlog.written
    s.stop()
    s = durable(tmp_path, fsync="always")
    check_world(stubs(s.address), "fs", sc, 2, {"m1": 2})
    s.stop()


@pytest.mark.parametrize("flags, words", [
    (("--fsync", "sometimes"), ("--fsync", "always, everysec or no")),
    (("--snapshot-bytes", "10"), ("--snapshot-bytes", ">= 4096")),
    (("--data-dir", "/proc/version"), ("--data-dir", "/proc/version")),
])
def test_bad_durability_flags_are_one_line_and_exit_2(flags, words):
    proc = subprocess.run([sys.executable, "-m", "sapgrid.server", "--listen", "127.0.0.1:0", "--metrics-port", "-1",
                           *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and all(w in proc.stderr for w in words), proc.stderr
    assert "listening" not in proc.stdout


class SlowFsync(storage_mod.FileOps):
    """Counts fsyncs; each takes 30 ms (a slow disk), so frames pile up behind one."""

    def __init__(self):
        self.calls = 0

    def datasync(self, fd):
        self.calls += 1
        time.sleep(0.03)
        return os.fdatasync(fd)


def test_fsync_always_groups_the_frames_waiting_for_one_fsync(tmp_path, stubs):
    s = durable(tmp_path, fsync="always")
    stub = stubs(s.address)
    create(stub, "grp", side=80.0)
    ops = SlowFsync()
    s.app.storage.syncer.io = ops
    apply(stub, "grp", 1, add_ids=np.arange(64), add_boxes=random_boxes(np.random.default_rng(1), 64, side=80.0))
    ops.calls = 0
    errors = []

    def send(k):
        rng = np.random.default_rng(k)
        try:
            for i in range(5):
                ids = np.array([k * 8 + i], np.uint64)
                apply(stub, "grp", i + 1, f"w{k}", update_ids=ids, update_boxes=random_boxes(rng, 1, side=80.0))
        except Exception as exc:                      # reported below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    st = info(stub, "grp").stats
    assert st.frames == 41 and dict(st.writers) == {f"w{k}": 5 for k in range(8)}
    assert 1 <= ops.calls <= 20, ops.calls            # 40 answers, far fewer fsyncs
    s.stop()


def test_a_refused_frames_record_left_in_the_log_is_refused_again_by_the_replay(tmp_path, stubs, caplog):
    """The engine refuses a frame and its record cannot be cut back (the server then stops): the replay
    meets the record, the engine refuses it again, and the world is as it was."""
    s = durable(tmp_path)
    ops = FailingOps()
    stub = stubs(s.address)
    create(stub, "left", side=80.0)
    s.app.registry.get("left").log.io = ops
    sc = Scene(13, n=50)
    apply(stub, "left", 1, "m1", **sc.first())
    size = os.path.getsize(_last_log(tmp_path, "left"))
    ops.fail_truncate = True
    code, _ = code_of(lambda: apply(stub, "left", 2, "m1", add_ids=[0], add_boxes=[[0, 0, 1, 1]]))   # a live id
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert os.path.getsize(_last_log(tmp_path, "left")) > size          # its record is still there
    s.stop()
    with caplog.at_level("INFO", logger="sapgrid.server"):
        s = durable(tmp_path)
    assert any("refused when received" in r.getMessage() for r in caplog.records)
    stub = stubs(s.address)
    check_world(stub, "left", sc, 1, {"m1": 1})
    apply(stub, "left", 2, "m1", **sc.move(5))
    s.stop()
    s = durable(tmp_path)
    check_world(stubs(s.address), "left", sc, 2, {"m1": 2})
    s.stop()


def test_a_frozen_world_stays_frozen_after_kill_9_and_an_unfrozen_one_thaws(tmp_path, stubs):
    data = tmp_path / "data"
    sc = Scene(21, n=200)
    proc, address = _spawn(data, "--fsync", "everysec")
    try:
        stub = stubs(address)
        for name in ("moving", "staying"):
            create(stub, name, side=80.0)
            apply(stub, name, 1, "m1", **sc.first())
        frozen = stub.FreezeWorld(pb.FreezeWorldRequest(name="moving", frozen=True), timeout=60).world
        assert frozen.stats.frozen
        assert "FROZEN" in world_files(tmp_path, "moving") and "FROZEN" not in world_files(tmp_path, "staying")
        os.kill(proc.pid, signal.SIGKILL)                   # a move in progress: the server dies
    finally:
        proc.kill()
        proc.wait(30)
    proc, address = _spawn(data, "--fsync", "everysec")
    try:
        stub = stubs(address)
        assert info(stub, "moving").stats.frozen and not info(stub, "staying").stats.frozen
        code, msg = code_of(lambda: apply(stub, "moving", 2, "m1", **sc.move()))
        assert code == grpc.StatusCode.UNAVAILABLE and "frozen" in msg
        assert info(stub, "moving").stats.frames == 1                       # refused, nothing applied
        assert apply(stub, "staying", 2, "m1", **sc.move()).frame == 2
        stub.FreezeWorld(pb.FreezeWorldRequest(name="moving", frozen=False), timeout=60)
        assert "FROZEN" not in world_files(tmp_path, "moving")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(30)
    proc, address = _spawn(data, "--fsync", "everysec")
    try:
        stub = stubs(address)
        assert not info(stub, "moving").stats.frozen
        assert apply(stub, "moving", 2, "m1", **sc.move()).frame == 2
    finally:
        proc.terminate()
        proc.wait(60)


class NoDirectory(storage_mod.FileOps):
    """Every new file fails (a full disk) once ``fail`` is set."""

    fail = False

    def open(self, path, flags, mode=0o777):
        if self.fail and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.open(path, flags, mode)


def test_a_freeze_that_cannot_be_written_is_unavailable_and_leaves_the_world_unfrozen(tmp_path, stubs):
    ops = NoDirectory()
    s = durable(tmp_path)
    try:
        s.app.registry.storage.io = ops
        stub = stubs(s.address)
        create(stub, "f", side=80.0)
        s.app.registry.worlds["f"].log.io = ops
        ops.fail = True
        code, msg = code_of(lambda: stub.FreezeWorld(pb.FreezeWorldRequest(name="f", frozen=True), timeout=60))
        assert code == grpc.StatusCode.UNAVAILABLE and "No space left" in msg and "not frozen" in msg
        assert not info(stub, "f").stats.frozen and "FROZEN" not in world_files(tmp_path, "f")
        assert not [f for f in world_files(tmp_path, "f") if f.endswith(".tmp")]
        ops.fail = False
        assert stub.FreezeWorld(pb.FreezeWorldRequest(name="f", frozen=True), timeout=60).world.stats.frozen
    finally:
        s.stop()


def test_frames_rejected_counts_since_the_server_started_and_recovery_starts_it_at_zero(tmp_path, stubs):
    s = durable(tmp_path, snapshot_bytes=4096)
    stub = stubs(s.address)
    create(stub, "rj", side=80.0)
    sc = Scene(31, n=100)
    apply(stub, "rj", 1, "m1", **sc.first())
    for _ in range(3):                                            # a gap: refused, counted
        code, _ = code_of(lambda: apply(stub, "rj", 40, "m1", **sc.move()))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
    for seq in range(2, 12):
        apply(stub, "rj", seq, "m1", **sc.move(20))              # the log is cut and snapshotted meanwhile
    assert s.app.registry.storage.wait_snapshots()
    assert len([f for f in world_files(tmp_path, "rj") if f.endswith(".snap")]) == 1
    assert min(world_files(tmp_path, "rj")) > "log-00000000000000000001"     # the snapshot holds the 3
    assert info(stub, "rj").stats.frames_rejected == 3
    s.stop()
    s = durable(tmp_path, snapshot_bytes=4096)
    stub = stubs(s.address)
    st = info(stub, "rj").stats
    assert st.frames == 11 and st.frames_rejected == 0
    code, _ = code_of(lambda: apply(stub, "rj", 40, "m1", **sc.move()))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and info(stub, "rj").stats.frames_rejected == 1
    s.stop()


class Recording(storage_mod.FileOps):
    """The syncer's calls, by name."""

    def __init__(self):
        self.calls = []

    def start_writeback(self, fd):
        self.calls.append("writeback")
        return storage_mod.start_writeback(fd)

    def datasync(self, fd):
        self.calls.append("datasync")
        return os.fdatasync(fd)

    def drop_cache(self, fd, end=0):
        self.calls.append("drop")
        return storage_mod.drop_cache(fd, end)


def test_everysec_starts_writeback_between_fsyncs_and_drops_the_synced_pages(tmp_path, stubs):
    s = durable(tmp_path, fsync="everysec")
    try:
        ops = Recording()
        s.app.registry.storage.syncer.io = ops
        stub = stubs(s.address)
        create(stub, "wb", side=400.0, cells=(16, 16))
        sc = Scene(41, n=12000, side=400.0)                       # a first frame of ~290 kB
        apply(stub, "wb", 1, "m1", **sc.first())
        deadline = time.monotonic() + 30
        while "drop" not in ops.calls or "writeback" not in ops.calls:
            assert time.monotonic() < deadline, ops.calls
            time.sleep(0.05)
        assert ops.calls[ops.calls.index("drop") - 1] == "datasync"   # dropped once on disk
        assert info(stub, "wb").stats.objects == 12000
    finally:
        s.stop()


class Reserving(storage_mod.FileOps):
    """The logs' block reservations, recorded; ``refuse``: they fail with that errno instead."""

    def __init__(self, refuse: int = 0):
        self.reserved, self.refuse = [], refuse

    def reserve(self, fd, offset, length):
        self.reserved.append((offset, length))
        if self.refuse:
            raise OSError(self.refuse, os.strerror(self.refuse))
        return storage_mod.reserve(fd, offset, length)


def test_a_log_reserves_its_blocks_ahead_and_its_size_stays_its_records(tmp_path, stubs):
    s = durable(tmp_path)
    try:
        ops = Reserving()
        s.app.storage.io = ops
        stub = stubs(s.address)
        create(stub, "ahead", side=80.0)
        sc = Scene(43)
        apply(stub, "ahead", 1, "m1", **sc.first())
        for k in range(2, 12):
            apply(stub, "ahead", k, "m1", **sc.move())
        path = _last_log(tmp_path, "ahead")
        st = os.stat(path)
        assert ops.reserved and ops.reserved[0][0] == 0
        assert len(ops.reserved) == 1, ops.reserved           # 1 MiB ahead holds these small records
        assert ops.reserved[0][1] == storage_mod.RESERVE_MIN
        assert st.st_size < storage_mod.RESERVE_MIN <= st.st_blocks * 512       # blocks held past the records
        assert s.app.storage.reserving
    finally:
        s.stop()
    s = durable(tmp_path)                                      # the size is the records': all recovered
    try:
        check_world(stubs(s.address), "ahead", sc, 11, {"m1": 11})
        assert not s.app.recovered.failed
    finally:
        s.stop()


@pytest.mark.parametrize("refuse", [errno.ENOSPC, errno.EOPNOTSUPP])
def test_a_reservation_that_fails_leaves_the_frame_to_its_write(tmp_path, stubs, refuse):
    s = durable(tmp_path)
    try:
        ops = Reserving(refuse)
        s.app.storage.io = ops
        stub = stubs(s.address)
        create(stub, "noresv", side=80.0)
        sc = Scene(44)
        apply(stub, "noresv", 1, "m1", **sc.first())
        apply(stub, "noresv", 2, "m1", **sc.move())
        apply(stub, "noresv", 3, "m1", **sc.move())
        check_world(stub, "noresv", sc, 3, {"m1": 3})
        # a full disk is tried again at the next record (a frame's and its answer's); a file system that
        # cannot reserve, never again
        assert len(ops.reserved) == (2 * 3 if refuse == errno.ENOSPC else 1)
        assert s.app.storage.reserving == (refuse == errno.ENOSPC)
    finally:
        s.stop()
