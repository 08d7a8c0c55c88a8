"""Durable worlds (``sapgrid serve --data-dir DIR``): a write-ahead log of each world's applied frames,
periodic snapshots, recovery on start.

Files (README "Durability")::

    DIR/LOCK                              held (flock) by the one server using DIR
    DIR/worlds/w-NAME/snap-N.snap         the world after its frame N (server/snapshot.py format)
    DIR/worlds/w-NAME/log-N.wal           the frames N+1, N+2, ... as received, one record each
    DIR/worlds/w-NAME/FROZEN              present while the world is frozen (FreezeWorld), fsynced

A log record: ``magic | payload length u32 | CRC32C of the payload u32 | payload``, payload =
``frame number u64 | seq u64 | writer length u8 | writer | body``. Magic ``b"SGWR"``: a frame, the body is
the request bytes as received (an ApplyFrameRequest / StreamFramesRequest: the Frame is its field 1).
Magic ``b"SGWA"``: the answer of a writer's frame (written after it is applied, before it is answered),
the body is the serialized Delta, so that a duplicate sent after a restart gets the very bytes it got.

The order of a frame (``WorldRunner._frame``, in the world's turn): checked (wire, writer's seq, budget),
appended here, applied by the engine, answered. A refusal by the engine takes the record back out
(``rollback``: the file is cut back to where it was); a record that cannot be written (disk full, I/O
error) refuses the frame UNAVAILABLE with the file cut back and the world unchanged. (The engine
validates a frame inside ``World.step``, before it changes anything; a separate validation pass first
would cost every frame a second pass over its ids and boxes, while refusals are rare: so the record is
written first and cut back on a refusal. If the server dies between the two, the replay meets that
record, the engine refuses it again, and nothing changes.) A log's disk blocks are reserved ahead of its
records (``reserve``: 32 records' worth, 1-8 MiB at a time; the file's size stays that of its records), so
that an append does not make the file system allocate them. ``--fsync``:

* ``always``: a frame is answered once its record is on disk. One syncer thread fsyncs every log with
  unsynced records and wakes the answers waiting for them (group commit: the frames of all worlds that
  arrive during one fsync share the next). An answer waits for its own record, not for the world's next
  frames: the world goes on with them while the fsync runs.
* ``everysec`` (default): the syncer fsyncs the logs with unsynced records once a second; kill -9 of the
  server loses nothing answered (the records are in the kernel's page cache), a power loss at most ~1 s.
* ``no``: the kernel writes when it likes.

Snapshots: when a world's log passes ``--snapshot-bytes``, the world's arrays are copied in its turn
(``WorldRunner.state``: numpy copies), its next frames go to a new log ``log-N.wal``, and a background
thread encodes and writes ``snap-N.snap`` (temp file, fsync, rename, directory fsync), then deletes the
snapshots and logs before N. Frames never wait for the encoding or the disk.

Recovery (``Storage.recover``, before health is SERVING): per world, the newest snapshot that reads
back whole, then every record of the logs from it on, replayed through the same apply path
(``WorldRunner.replay``). A record cut short at the end of the last log (torn by a crash) is dropped and
logged; a damaged record anywhere else stops that world's recovery with an error naming the file and
the offset, and that world is not served (the others are).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import re
import shutil
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import google_crc32c

from . import protocol, snapshot
from .errors import Unavailable, WorldExists

log = logging.getLogger("sapgrid.server")

FSYNC_MODES = ("always", "everysec", "no")
RECORD_MAGIC = b"SGWR"                      # a frame's record: the request as received
ANSWER_MAGIC = b"SGWA"                      # a writer's frame's answer: the serialized Delta
_RECORD = struct.Struct("<4sII")           # magic, payload length, CRC32C of the payload
_PAYLOAD = struct.Struct("<QQB")           # frame number, seq, writer length
RECORD_HEADER = _RECORD.size
FROZEN_FILE = "FROZEN"                     # in a world's directory: the world is frozen (FreezeWorld)
_SNAP_RE = re.compile(r"^snap-(\d{20})\.snap$")
_LOG_RE = re.compile(r"^log-(\d{20})\.wal$")
WORLD_PREFIX = "w-"
SYNC_PERIOD_S = 1.0                        # --fsync everysec: every log with new records fsynced this often
WRITEBACK_PERIOD_S = 0.1                   # and, between, its new records' writeback started this often
WRITEBACK_BYTES = 256 << 10                # once at least this much is new
# a log's blocks are reserved ahead of its records (``reserve``), this many records' worth at a time (the last
# record's size), within these bounds, and never far past the size at which the log is cut
RESERVE_RECORDS = 32
RESERVE_MIN = 1 << 20
RESERVE_MAX = 8 << 20
_NOT_SUPPORTED = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
# worlds recovered at a time: a world's replay is mostly Python (one core, the GIL) and its kernels use the
# engine's threads, so on 2 cores two at a time were slower (0.85x, ``recovery_of_many`` in
# tools/bench_durable.py); a core pair per world beyond that
RECOVERY_WORKERS = max(1, min(4, (os.cpu_count() or 1) // 2))


def _libc(name: str, *argtypes):
    """The C library's function ``name`` (an int result, errno kept), or None where it has none: Linux calls
    the ``os`` module does not offer (``sync_file_range(2)``, ``fallocate(2)`` with its mode)."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc("sync_file_range", ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_SYNC_FILE_RANGE_WRITE = 2                 # <linux/fs.h>: start writeback of the dirty pages, do not wait


def start_writeback(fd: int) -> None:
    """Start the kernel's writeback of ``fd``'s dirty pages now, without waiting for it (Linux; elsewhere
    nothing): the log reaches the disk in small pieces as it grows, instead of one burst per fsync."""
    if _SYNC_FILE_RANGE is not None and _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


# fallocate(2) with a mode: os.posix_fallocate cannot keep the size
_FALLOCATE = _libc("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_FALLOC_FL_KEEP_SIZE = 1                   # <linux/falloc.h>: the blocks are reserved, the file's size unchanged


def reserve(fd: int, offset: int, length: int) -> None:
    """Reserve the disk blocks of ``fd``'s bytes ``offset`` .. ``offset + length`` without changing its size
    (Linux ``fallocate(2)`` with ``FALLOC_FL_KEEP_SIZE``). A log's records then go into blocks the file system
    already holds for it: the append does not allocate them (~20% of a 240 KB record's write on ext4), and a
    reader still sees only the records (the size is theirs). OSError (EOPNOTSUPP where the file system or
    the C library cannot)."""
    if _FALLOCATE is None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
    if _FALLOCATE(fd, _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def drop_cache(fd: int, end: int = 0) -> None:
    """Drop ``fd``'s clean pages from the page cache, those before byte ``end`` (rounded down to a page: the
    page the log's next record goes on stays, or that write would first read it back from the disk; 0:
    the whole file). A log is read back only by a recovery, so its synced pages would only crowd out the
    pages of everything else on the machine."""
    if end:
        end -= end % _PAGE
        if not end:
            return
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, end, os.POSIX_FADV_DONTNEED)


class FileOps:
    """The file operations of the log and the snapshots: the seam where tests inject write failures."""

    open = staticmethod(os.open)
    pwritev = staticmethod(os.pwritev)
    fsync = staticmethod(os.fsync)             # snapshots and new files
    datasync = staticmethod(os.fdatasync)      # the logs: their data and size, not their times
    ftruncate = staticmethod(os.ftruncate)
    close = staticmethod(os.close)
    start_writeback = staticmethod(start_writeback)
    drop_cache = staticmethod(drop_cache)
    reserve = staticmethod(reserve)


def _snap_name(n: int) -> str:
    return f"snap-{n:020d}.snap"


def _log_name(n: int) -> str:
    return f"log-{n:020d}.wal"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class RecoveryError(Exception):
    """A world's files cannot be recovered (damaged record or snapshot): the world is not served."""


class WorldLog:
    """One world's log and snapshots. ``append`` / ``rollback`` / ``applied`` are called in the world's turn."""

    def __init__(self, storage: "Storage", name: str, path: str, base: int, fd: int, size: int):
        self.storage, self.name, self.path = storage, name, path
        self.base, self.fd, self.size = base, fd, size
        self.reserved = size          # the file's blocks are reserved up to here (``reserve``)
        self.io = storage.io
        self.sync_always = storage.fsync == "always"
        self.written = 0              # bytes appended since open (only grows): positions for wait_synced
        self.synced = 0               # of those, on disk
        self.kicked = 0               # of those, writeback started (everysec, between the fsyncs)
        self.sync_error: str | None = None     # of the last fsync attempt
        self.sync_attempts = 0
        self.broken = False           # a failed write could not be cut back: cut it before the next append
        self.closed = False
        self.snapshotting = False     # a snapshot of this world is being written
        self.cut_at = storage.snapshot_bytes    # the log size at which it is cut next
        self.retired: list[int] = []  # fds of cut logs, fsynced and closed by the syncer
        self.dir_dirty = False        # a file was created in the world's directory
        self.lock = threading.Lock()  # fd/retired/closed against the syncer and deletion

    # ---- in the world's turn ----------------------------------------------------------------------
    def append(self, raw: bytes, frame: int, seq: int = 0, writer: str = "") -> int:
        """Write the record of frame number ``frame``; return the mark to ``rollback`` to. Raises
        Unavailable (the file cut back, nothing changed) if it cannot be written."""
        if self.closed:
            raise Unavailable(f"world {self.name!r} was deleted")
        try:
            if self.broken:
                self._cut_back(self.size)
            return self._write(RECORD_MAGIC, raw, frame, seq, writer)
        except Unavailable:
            if self.storage.metrics is not None:
                self.storage.metrics.log_write_failures.inc()
            raise

    def append_answer(self, answer: bytes, frame: int, seq: int, writer: str) -> None:
        """After a writer's frame: its answer (the serialized Delta), so that a duplicate sent after a
        restart gets these very bytes. If it cannot be written, the frame stands (it is applied and its
        record is in the log); a duplicate after a restart then gets the Delta the replay made (same
        pairs, frame and digest; the replay's timings)."""
        try:
            self._write(ANSWER_MAGIC, answer, frame, seq, writer)
        except Unavailable as exc:
            log.warning("world %r: the answer of frame %d was not logged: %s", self.name, frame, exc)

    def _write(self, magic: bytes, raw: bytes, frame: int, seq: int, writer: str) -> int:
        wname = writer.encode()
        payload_head = _PAYLOAD.pack(frame, seq, len(wname)) + wname
        crc = google_crc32c.extend(google_crc32c.value(payload_head), raw)
        head = _RECORD.pack(magic, len(payload_head) + len(raw), crc)
        mark = self.size
        total = len(head) + len(payload_head) + len(raw)
        if mark + total > self.reserved and self.storage.reserving:
            self._reserve(mark, total)
        try:
            done = 0
            bufs = [head, payload_head, raw]
            while done < total:
                n = self.io.pwritev(self.fd, bufs, mark + done)
                if n <= 0:
                    raise OSError(errno.EIO, "write returned 0")
                done += n
                bufs = _skip(bufs, n)
        except OSError as exc:
            self._cut_back(mark, exc)
            raise Unavailable(f"world {self.name!r}: the frame cannot be written to the world's log "
                              f"({_reason(exc)}); it was not applied, the world is unchanged") from None
        self.size = mark + total
        self.written += total
        return mark

    def _reserve(self, mark: int, total: int) -> None:
        """Reserve the blocks of the next records (from ``mark``, at least ``total`` bytes). Where the file system
        cannot, the storage stops trying; any other failure (the disk full) is left to the write itself."""
        length = min(RESERVE_MAX, max(RESERVE_MIN, RESERVE_RECORDS * total))
        length = max(total, min(length, self.cut_at + total - mark))      # the log is cut after cut_at
        try:
            self.io.reserve(self.fd, mark, length)
        except OSError as exc:
            if exc.errno in _NOT_SUPPORTED:
                self.storage.reserving = False
                log.info("the data directory's file system cannot reserve blocks ahead of the logs (%s); the logs "
                         "grow by their writes", _reason(exc))
            return
        self.reserved = mark + length

    def _cut_back(self, mark: int, cause: OSError | None = None) -> None:
        self.reserved = min(self.reserved, mark)      # a cut frees the blocks past it, reserved ones too
        try:
            self.io.ftruncate(self.fd, mark)
            self.broken = False
        except OSError as exc:
            self.broken = True
            what = f"cannot be written ({_reason(cause)}) nor" if cause is not None else "could not be"
            raise Unavailable(f"world {self.name!r}: its log {what} cut back after a failed write ({_reason(exc)}); "
                              f"frames are refused, the world unchanged, until it can") from None

    def rollback(self, mark: int) -> None:
        """The engine refused the frame just appended: its record leaves the log."""
        try:
            self._cut_back(mark)
        except Unavailable:
            log.error("world %r: a refused frame's record could not be cut from its log; it will be cut before "
                      "the next frame (recovery skips it anyway: the engine refuses it again)", self.name)
        self.size = mark

    def applied(self, runner) -> None:
        """After a frame: past ``--snapshot-bytes``, cut the log and snapshot the world (written outside)."""
        if self.size < self.cut_at or self.snapshotting:
            return
        try:
            state = runner.state()
            base = runner.frames
            fd = self.io.open(os.path.join(self.path, _log_name(base)), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                              0o644)
        except OSError as exc:
            self.cut_at = self.size + max(self.storage.snapshot_bytes // 4, 1)     # try again a little later
            log.warning("world %r: cannot start a new log (%s); the current one goes on", self.name, _reason(exc))
            return
        self.cut_at = self.storage.snapshot_bytes
        with self.lock:
            old = self.fd
            self.fd, self.base, self.size, self.reserved = fd, base, 0, 0
            self.snapshotting = True
            if self.storage.fsync != "no":        # the syncer fsyncs and closes it, and the directory
                self.retired.append(old)
                self.dir_dirty = True
        if self.storage.fsync == "no":
            self.io.close(old)
        self.storage.enqueue_snapshot(self, state)

    def set_frozen(self, frozen: bool) -> None:
        """FreezeWorld: the world's flag, on disk before it is answered (``FROZEN`` in its directory, made
        durably or removed and the directory fsynced), so that a crash never thaws a world being moved.
        Raises Unavailable (nothing changed) if it cannot be written."""
        file = os.path.join(self.path, FROZEN_FILE)
        try:
            if frozen and not os.path.exists(file):
                _write_durably(self.io, self.path, FROZEN_FILE, b"frozen\n")
            elif not frozen and os.path.exists(file):
                os.unlink(file)
                _fsync_dir(self.path)
        except OSError as exc:
            raise Unavailable(f"world {self.name!r}: its frozen flag cannot be written in the data directory "
                              f"({_reason(exc)}); the world is not {'frozen' if frozen else 'unfrozen'}") from None

    def sync_point(self):
        """What an answer waits for under --fsync always: everything written so far on disk."""
        return (self, self.written)

    def wait_synced(self, position: int) -> None:
        self.storage.syncer.wait(self, position)

    # ---- outside the turn -------------------------------------------------------------------------
    def write_snapshot(self, state: snapshot.State) -> None:
        """Write ``snap-N.snap`` durably, then delete what it replaces (snapshots and logs before N)."""
        n = state.frames
        data = snapshot.encode(state)
        _write_durably(self.io, self.path, _snap_name(n), data)
        with self.lock:
            if self.closed:
                return
        for entry in os.listdir(self.path):
            m = _SNAP_RE.match(entry) or _LOG_RE.match(entry)
            if m and int(m.group(1)) < n:
                _unlink(os.path.join(self.path, entry))

    def delete(self) -> None:
        """The world is deleted: its files go."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            fds, self.retired = [self.fd, *self.retired], []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.storage.remove_dir(self.path)
        self.storage.syncer.forget(self)


def _skip(bufs: list, n: int) -> list:
    """The buffers left after ``n`` bytes of them were written."""
    out = []
    for b in bufs:
        if n >= len(b):
            n -= len(b)
            continue
        out.append(memoryview(b)[n:] if n else b)
        n = 0
    return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _write_durably(io: FileOps, directory: str, name: str, data: bytes) -> None:
    """``directory/name`` holds ``data`` whole, or is not changed: temp file, fsync, rename, dir fsync."""
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done, view = 0, memoryview(data)
        while done < len(data):
            n = io.pwritev(fd, [view[done:]], done)
            if n <= 0:
                raise OSError(errno.EIO, "write returned 0")
            done += n
        io.fsync(fd)
    except BaseException:
        io.close(fd)
        _unlink(tmp)
        raise
    io.close(fd)
    os.replace(tmp, os.path.join(directory, name))
    _fsync_dir(directory)


class Syncer:
    """The one thread that fsyncs the logs: group commit under ``always``, once a second under ``everysec``."""

    def __init__(self, mode: str, io: FileOps, metrics=None):
        self.mode, self.io, self.metrics = mode, io, metrics
        self.logs: set[WorldLog] = set()
        self.cond = threading.Condition()
        self.stopping = False
        self.thread: threading.Thread | None = None
        if mode != "no":
            self.thread = threading.Thread(target=self._run, name="sapgrid-fsync", daemon=True)
            self.thread.start()

    def add(self, wlog: WorldLog) -> None:
        with self.cond:
            self.logs.add(wlog)

    def forget(self, wlog: WorldLog) -> None:
        with self.cond:
            self.logs.discard(wlog)
            self.cond.notify_all()

    def wait(self, wlog: WorldLog, position: int) -> None:
        with self.cond:
            start, error = wlog.sync_attempts, None
            if wlog.synced < position:
                self.cond.notify_all()               # a frame waits: sync now
                while wlog.synced < position and not wlog.closed and not self.stopping:
                    if wlog.sync_error and wlog.sync_attempts > start:    # an attempt for this frame failed
                        error = wlog.sync_error
                        break
                    self.cond.wait(1.0)
        if error and wlog.synced < position:
            raise Unavailable(f"world {wlog.name!r}: the frame was applied but its log record could not be made "
                              f"durable ({error}); send it again with its writer and seq for its answer")

    def _dirty(self) -> list:
        return [w for w in self.logs if w.synced < w.written or w.retired or w.dir_dirty]

    def _run(self) -> None:
        next_sync = time.monotonic() + SYNC_PERIOD_S
        while True:
            with self.cond:
                if self.mode == "always":
                    while not self.stopping and not self._dirty():
                        self.cond.wait(1.0)
                else:
                    self.cond.wait_for(lambda: self.stopping, WRITEBACK_PERIOD_S)
                if self.stopping:
                    return
                if self.mode == "everysec" and time.monotonic() < next_sync:
                    kick = [w for w in self.logs if w.written - w.kicked >= WRITEBACK_BYTES and not w.closed]
                    for w in kick:
                        w.kicked = w.written
                else:
                    kick = None
                    next_sync = time.monotonic() + SYNC_PERIOD_S
                    work = [(w, w.written) for w in self._dirty()]
            if kick is not None:                    # between the fsyncs: writeback started, not waited for
                for w in kick:
                    self._start_writeback(w)
                continue
            failed = False
            for w, upto in work:
                failed |= not self._sync(w, upto)
            with self.cond:
                self.cond.notify_all()
                if failed:                          # an I/O error: retry, not in a tight loop
                    self.cond.wait_for(lambda: self.stopping, 0.2)

    def _start_writeback(self, w: WorldLog) -> None:
        with w.lock:
            if w.closed:
                return
            fd = w.fd
        try:
            self.io.start_writeback(fd)
        except OSError as exc:               # only a hint: the next fsync writes it all the same
            log.debug("world %r: writeback of its log not started: %s", w.name, _reason(exc))

    def _drop_cache(self, w: WorldLog, fd: int, end: int = 0) -> None:
        try:
            self.io.drop_cache(fd, end)
        except OSError as exc:               # only a hint
            log.debug("world %r: its synced log stays in the page cache: %s", w.name, _reason(exc))

    def _sync(self, w: WorldLog, upto: int) -> bool:
        """Fsync ``w`` (its cut logs first); False on an I/O error."""
        with w.lock:
            if w.closed:
                return True
            retired, w.retired = w.retired, []
            fd, dir_dirty, end = w.fd, w.dir_dirty, w.size       # the fdatasync below covers the bytes before end
            w.dir_dirty = False
        try:
            while retired:                          # a cut log's last records first
                self.io.datasync(retired[0])
                self._drop_cache(w, retired[0])
                self.io.close(retired.pop(0))       # taken off the list first: never closed twice
            if dir_dirty:
                _fsync_dir(w.path)
            t0 = time.perf_counter()
            self.io.datasync(fd)
            if self.metrics is not None:
                self.metrics.fsync_seconds.observe(time.perf_counter() - t0)
            if self.mode != "always":               # (under always, a group commit's wait stays short)
                self._drop_cache(w, fd, end)
        except OSError as exc:
            if w.closed:
                return True
            log.error("world %r: fsync of its log failed: %s", w.name, _reason(exc))
            if self.metrics is not None:
                self.metrics.fsync_failures.inc()
            with w.lock:
                w.retired[:0] = retired             # the ones not synced yet: next time
                w.dir_dirty = w.dir_dirty or dir_dirty
            w.sync_error = _reason(exc)
            w.sync_attempts += 1
            return False
        w.sync_error = None
        w.synced = max(w.synced, upto)
        w.sync_attempts += 1
        return True

    def flush_all(self) -> None:
        """Fsync every log now (a graceful stop)."""
        with self.cond:
            work = [(w, w.written) for w in self.logs]
        for w, upto in work:
            self._sync(w, upto)

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(5.0)


@dataclass
class Recovered:
    """What recovery did (for logs and tests)."""

    worlds: list
    failed: dict                  # world name -> error message


class Storage:
    """A server's data directory."""

    def __init__(self, root: str, fsync: str = "everysec", snapshot_bytes: int = 64 << 20,
                 io: FileOps | None = None, metrics=None):
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        self.root = os.path.abspath(root)
        self.worlds_dir = os.path.join(self.root, "worlds")
        self.fsync, self.snapshot_bytes = fsync, int(snapshot_bytes)
        self.io = io or FileOps()
        self.reserving = True                 # the logs' blocks are reserved ahead (until the file system says it cannot)
        self.metrics = metrics                # server.metrics.Metrics, or None
        os.makedirs(self.worlds_dir, exist_ok=True)
        self._lock_fd = os.open(os.path.join(self.root, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ValueError(f"{self.root} is in use by another sapgrid server") from None
        self.syncer = Syncer(fsync, self.io, metrics)
        self._jobs: list = []
        self._jobs_cond = threading.Condition()
        self._stopping = False
        self._snapshotter = threading.Thread(target=self._snapshots, name="sapgrid-snapshots", daemon=True)
        self._snapshotter.start()

    # ---- worlds ----------------------------------------------------------------------------------
    def world_dir(self, name: str) -> str:
        return os.path.join(self.worlds_dir, WORLD_PREFIX + name)

    def open_world(self, runner) -> WorldLog:
        """A new world's files: its first snapshot (durable) and an empty log. Raises Unavailable."""
        path = self.world_dir(runner.name)
        tmp = os.path.join(self.worlds_dir, f".new-{runner.name}-{uuid.uuid4().hex[:8]}")
        state = runner.state()
        if os.path.exists(path):
            raise WorldExists(f"world {runner.name!r}: the data directory holds files of a world of that name that "
                              f"could not be recovered ({path}); move them away to use the name", "name")
        try:
            os.mkdir(tmp)
            _write_durably(self.io, tmp, _snap_name(state.frames), snapshot.encode(state))
            fd = self.io.open(os.path.join(tmp, _log_name(state.frames)), os.O_WRONLY | os.O_CREAT, 0o644)
            self.io.fsync(fd)
            _fsync_dir(tmp)
            os.rename(tmp, path)
            _fsync_dir(self.worlds_dir)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise Unavailable(f"world {runner.name!r}: its files cannot be written in the data directory "
                              f"({_reason(exc)}); the world was not created") from None
        return self._attach(runner.name, path, state.frames, fd, 0)

    def _attach(self, name: str, path: str, base: int, fd: int, size: int) -> WorldLog:
        wlog = WorldLog(self, name, path, base, fd, size)
        self.syncer.add(wlog)
        return wlog

    def remove_dir(self, path: str) -> None:
        """A world's directory goes: renamed out of the way first (a crash never leaves half a world)."""
        trash = os.path.join(self.worlds_dir, f".deleted-{uuid.uuid4().hex}")
        try:
            os.rename(path, trash)
            _fsync_dir(self.worlds_dir)
        except OSError as exc:
            log.error("cannot delete %s: %s", path, _reason(exc))
            return
        shutil.rmtree(trash, ignore_errors=True)

    # ---- snapshots -------------------------------------------------------------------------------
    def enqueue_snapshot(self, wlog: WorldLog, state) -> None:
        with self._jobs_cond:
            self._jobs.append((wlog, state))
            self._jobs_cond.notify()

    def _snapshots(self) -> None:
        while True:
            with self._jobs_cond:
                self._jobs_cond.wait_for(lambda: self._jobs or self._stopping)
                if not self._jobs:
                    return
                wlog, state = self._jobs.pop(0)
            try:
                if not wlog.closed:
                    t0 = time.perf_counter()
                    wlog.write_snapshot(state)
                    log.debug("world %r: snapshot at frame %d written in %.3f s", wlog.name, state.frames,
                              time.perf_counter() - t0)
                    self._snapshot_outcome("ok")
            except OSError as exc:
                if not wlog.closed:
                    self._snapshot_outcome("failed")
                    log.error("world %r: snapshot at frame %d cannot be written (%s); its log goes on growing until "
                              "one can", wlog.name, state.frames, _reason(exc))
            except Exception:
                log.exception("world %r: snapshot failed", wlog.name)
            finally:
                wlog.snapshotting = False

    def _snapshot_outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.snapshots.labels(outcome).inc()

    def wait_snapshots(self, timeout: float = 30.0) -> bool:
        """Wait until no snapshot is queued or being written (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._jobs_cond:
                busy = bool(self._jobs)
            if not busy and not any(w.snapshotting for w in list(self.syncer.logs)):
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        """Graceful stop: snapshots finish, every log is fsynced and closed."""
        self.wait_snapshots()
        with self._jobs_cond:
            self._stopping = True
            self._jobs_cond.notify_all()
        self._snapshotter.join(10.0)
        self.syncer.flush_all()
        self.syncer.stop()
        for w in list(self.syncer.logs):
            with w.lock:
                fds, w.retired = [w.fd, *w.retired], []
                w.closed = True
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        try:
            os.close(self._lock_fd)
        except OSError:
            pass

    # ---- recovery --------------------------------------------------------------------------------
    def recover(self, registry, workers: int | None = None) -> Recovered:
        """Every world of the directory, back in ``registry`` as it was after its last answered frame.

        Worlds recover independently, ``workers`` at a time (default ``RECOVERY_WORKERS``: the engine's
        kernels release the GIL, so while one world decodes its snapshot or a frame another one's kernels
        can run, where there are cores for both). Returns once every world is done (or failed)."""
        todo = []
        for entry in sorted(os.listdir(self.worlds_dir)):
            path = os.path.join(self.worlds_dir, entry)
            if entry.startswith(".") and os.path.isdir(path):       # a creation or deletion cut short
                shutil.rmtree(path, ignore_errors=True)
                continue
            if not entry.startswith(WORLD_PREFIX) or not os.path.isdir(path):
                continue
            todo.append((entry[len(WORLD_PREFIX):], path))

        def one(item):
            name, path = item
            t0 = time.perf_counter()
            try:
                runner = self._recover_world(registry, name, path)
            except RecoveryError as exc:
                log.error("world %r is not served: %s", name, exc)
                return name, str(exc)
            log.info("world %r recovered: %d objects, %d frames, %d pairs in %.3f s", name, runner.objects,
                     runner.frames, runner.pairs, time.perf_counter() - t0)
            return name, None

        workers = max(1, min(workers or RECOVERY_WORKERS, len(todo)))
        if workers > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="sapgrid-recovery") as pool:
                results = list(pool.map(one, todo))
        else:
            results = [one(item) for item in todo]
        done = [name for name, error in results if error is None]
        failed = {name: error for name, error in results if error is not None}
        if self.metrics is not None:
            self.metrics.worlds_unrecovered.set(len(failed))
        return Recovered(done, failed)

    def _recover_world(self, registry, name: str, path: str):
        from sapcore import WorldConfig

        files = os.listdir(path)
        for f in files:
            if f.endswith(".tmp"):
                _unlink(os.path.join(path, f))
        snaps = sorted((int(m.group(1)) for f in files if (m := _SNAP_RE.match(f))), reverse=True)
        logs = sorted(int(m.group(1)) for f in files if (m := _LOG_RE.match(f)))
        state = None
        for n in snaps:
            file = os.path.join(path, _snap_name(n))
            try:
                with open(file, "rb") as fh:
                    state = snapshot.decode(fh.read())
                break
            except (OSError, snapshot.SnapshotError) as exc:
                log.warning("world %r: snapshot %s cannot be read (%s); trying an older one", name, file, exc)
        if state is None:
            raise RecoveryError(f"no readable snapshot in {path}")
        try:
            config = WorldConfig(dims=state.dims, bounds=state.bounds, cells=state.cells,
                                 threads=state.threads or registry.engine_threads or None,
                                 max_objects=state.max_objects, coord_limit=state.coord_limit)
            runner = registry.create(name, config, state.expected_objects, state=state, recovered=True)
        except Exception as exc:
            raise RecoveryError(f"its snapshot {path}/{_snap_name(state.frames)} does not make a world ({exc})") \
                from None
        runner.rejected = 0          # refusals are not logged: counted since the server started (WorldStats)
        try:
            base, size, fd = self._replay(runner, path, [b for b in logs if b >= state.frames], state.frames)
        except Exception as exc:
            registry.delete(name, recovered=True)
            if isinstance(exc, RecoveryError):
                raise
            raise RecoveryError(f"replay of its log failed: {exc}") from None
        for f in os.listdir(path):                  # what the newest readable snapshot replaces
            m = _SNAP_RE.match(f) or _LOG_RE.match(f)
            if m and int(m.group(1)) < state.frames:
                _unlink(os.path.join(path, f))
        runner.frozen = os.path.exists(os.path.join(path, FROZEN_FILE))       # a move in progress stays frozen
        runner.log = self._attach(name, path, base, fd, size)
        return runner

    def _replay(self, runner, path: str, bases: list, start: int) -> tuple[int, int, int]:
        """Replay the logs ``bases`` (in order) into ``runner``; (base, size, fd) of the log to go on with."""
        from sapcore.errors import SapcoreError

        if not bases:
            bases = [start]
            fd = self.io.open(os.path.join(path, _log_name(start)), os.O_WRONLY | os.O_CREAT, 0o644)
            return start, 0, fd
        end = 0
        for k, base in enumerate(bases):
            file = os.path.join(path, _log_name(base))
            last = k == len(bases) - 1
            if base != runner.frames:
                raise RecoveryError(f"{file}: starts after frame {base}, but the world is at frame {runner.frames} "
                                    f"(a log is missing)")
            with open(file, "rb") as fh:
                data = fh.read()
            end = 0
            while end < len(data):
                rec = _read_record(data, end)
                if rec is None:                    # cut short (or zeros) up to the end of the file: torn
                    if not last:
                        raise RecoveryError(f"{file}: record at offset {end} is cut short, and later logs follow")
                    log.warning("world %r: %s: the record at offset %d is torn (%d bytes to the end); dropped",
                                runner.name, file, end, len(data) - end)
                    break
                if rec is False:
                    raise RecoveryError(f"{file}: record at offset {end} is damaged (bad magic or checksum)")
                magic, frame_no, seq, writer, raw, size = rec
                if magic == ANSWER_MAGIC:          # the answer of the frame just replayed
                    if frame_no == runner.frames and writer:
                        runner.writers.replace_answer(writer, seq, raw)
                    end += size
                    continue
                if frame_no != runner.frames + 1:
                    raise RecoveryError(f"{file}: record at offset {end} is frame {frame_no}, expected frame "
                                        f"{runner.frames + 1}")
                try:
                    frame = protocol.read_frame(raw)
                    arrays = protocol.frame_arrays(frame, runner.dims)
                    runner.replay(arrays, seq, writer)
                except (SapcoreError, Unavailable) as exc:
                    # appended, then refused by the engine, and the server stopped before cutting it out:
                    # the engine refuses it again, and nothing changes
                    log.info("world %r: %s: frame at offset %d was refused when received (%s); skipped",
                             runner.name, file, end, exc)
                except Exception as exc:
                    raise RecoveryError(f"{file}: record at offset {end} cannot be replayed ({exc})") from None
                end += size
            if last and end < len(data):
                with open(file, "r+b") as fh:
                    fh.truncate(end)
                    fh.flush()
                    os.fsync(fh.fileno())
        fd = self.io.open(os.path.join(path, _log_name(bases[-1])), os.O_WRONLY, 0o644)
        return bases[-1], end, fd


def _read_record(data: bytes, i: int):
    """(magic, frame, seq, writer, raw, record size) of the record at ``i``; None if it is cut short by the end of
    the data (or only zeros follow: a tail the file system never filled); False if it is damaged."""
    rest = len(data) - i
    if rest < RECORD_HEADER:
        return None
    magic, length, crc = _RECORD.unpack_from(data, i)
    if magic not in (RECORD_MAGIC, ANSWER_MAGIC):
        return None if not data[i:].strip(b"\0") else False
    if RECORD_HEADER + length > rest:
        return None
    payload = data[i + RECORD_HEADER:i + RECORD_HEADER + length]
    if google_crc32c.value(payload) != crc or length < _PAYLOAD.size:
        return False
    frame_no, seq, n = _PAYLOAD.unpack_from(payload, 0)
    if _PAYLOAD.size + n > length:
        return False
    try:
        writer = payload[_PAYLOAD.size:_PAYLOAD.size + n].decode()
    except UnicodeDecodeError:
        return False
    return magic, frame_no, seq, writer, payload[_PAYLOAD.size + n:], RECORD_HEADER + length
