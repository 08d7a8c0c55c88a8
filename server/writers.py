"""Exactly-once frames: each writer's last applied seq and its recent answers (Frame.writer in the contract).

A frame with a writer is applied only as the next of that writer's sequence (``seq == last + 1``; a writer
the world does not know yet may start at any seq >= 1). A frame it already applied (``seq <= last``) is
never applied again: it is answered with the serialized Delta it got the first time, kept here while it
is one of the writer's ``keep`` most recent answers and within ``byte_limit`` bytes of them (the most
recent answer is always kept), else refused FAILED_PRECONDITION naming the last applied seq. A gap
(``seq > last + 1``) is FAILED_PRECONDITION naming the expected seq.

The world checks and records in its turn (``WorldRunner.apply``), so two streams of one writer can never
apply the same seq twice. The table is part of the world's state: snapshots and the log carry it.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from .errors import InvalidInput, SeqConflict

WRITER_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
KEEP = 256                      # answers kept per writer, at least (fewer only past the byte bound)
BYTE_LIMIT = 16 << 20           # bytes of answers kept per writer


def check_writer(writer: str, seq: int) -> None:
    """INVALID_ARGUMENT for a bad writer name, or seq 0 with a writer."""
    if not writer:
        return
    if not WRITER_RE.match(writer):
        shown = writer if len(writer) <= 80 else writer[:80] + "..."
        raise InvalidInput(f"writer: {shown!r} is not 1-64 characters of [A-Za-z0-9_.-]", "writer")
    if seq == 0:
        raise InvalidInput(f"seq: 0 with writer {writer!r}: a writer's frames are numbered from 1", "seq")


@dataclass
class Writer:
    """One writer: its last applied seq and its recent answers, oldest first."""

    last: int
    recent: deque = field(default_factory=deque)     # (seq, serialized Delta bytes)
    nbytes: int = 0


class Writers:
    """The writers of one world. Not thread safe: used in the world's turn only."""

    def __init__(self, keep: int = KEEP, byte_limit: int = BYTE_LIMIT):
        self.keep, self.byte_limit = keep, byte_limit
        self.table: dict[str, Writer] = {}

    def answer(self, writer: str, seq: int) -> bytes | None:
        """None: apply the frame. bytes: a duplicate, answered with these bytes. Raises SeqConflict."""
        w = self.table.get(writer)
        if w is None or seq == w.last + 1:
            return None
        if seq > w.last:
            raise SeqConflict(f"writer {writer!r}: expected seq {w.last + 1}, got {seq} (a gap; last applied seq "
                              f"is {w.last})")
        if w.recent and w.recent[0][0] <= seq:
            # the answers are consecutive seqs: the index is the distance from the oldest kept
            first = w.recent[0][0]
            kept_seq, raw = w.recent[seq - first]
            if kept_seq == seq:
                return raw
        raise SeqConflict(f"writer {writer!r}: seq {seq} is older than the last {len(w.recent)} deltas kept; last "
                          f"applied seq is {w.last}")

    def record(self, writer: str, seq: int, raw: bytes) -> None:
        """The frame ``seq`` of ``writer`` was applied and answered with ``raw``."""
        w = self.table.get(writer)
        if w is None or (w.recent and w.recent[-1][0] != seq - 1):
            w = self.table[writer] = Writer(seq)
        w.last = seq
        w.recent.append((seq, raw))
        w.nbytes += len(raw)
        while len(w.recent) > 1 and (len(w.recent) > self.keep or w.nbytes > self.byte_limit):
            w.nbytes -= len(w.recent.popleft()[1])

    def replace_answer(self, writer: str, seq: int, raw: bytes) -> None:
        """The answer of ``writer``'s last frame ``seq`` is ``raw`` (recovery: the bytes first sent)."""
        w = self.table.get(writer)
        if w is not None and w.recent and w.recent[-1][0] == seq:
            w.nbytes += len(raw) - len(w.recent[-1][1])
            w.recent[-1] = (seq, bytes(raw))

    def seqs(self) -> dict[str, int]:
        """Each writer -> its last applied seq."""
        return {name: w.last for name, w in dict(self.table).items()}    # a copy: read outside the turn

    def copy_state(self) -> list[tuple[str, int, list]]:
        """(name, last, [(seq, bytes), ...]) of every writer: a consistent copy for a snapshot (in the turn)."""
        return [(name, w.last, list(w.recent)) for name, w in sorted(self.table.items())]

    @classmethod
    def from_state(cls, state, keep: int = KEEP, byte_limit: int = BYTE_LIMIT) -> "Writers":
        writers = cls(keep, byte_limit)
        for name, last, recent in state:
            w = writers.table[name] = Writer(int(last))
            for seq, raw in recent:
                w.recent.append((int(seq), bytes(raw)))
                w.nbytes += len(raw)
        return writers
