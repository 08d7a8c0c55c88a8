"""Build the conformance vectors (conformance/vectors/*.json) from the scenarios below.

Every client of the contract (Python, Node, C++, ...) replays these files against a real server and must
get exactly the bytes and values they hold. One file is one scenario:

    {"name", "description", "world": {"dims", "bounds", "cells"},
     "steps": [{"frame": {"seq", "writer", <bulk field>: "<hex of its exact bytes>", ...},
                "expect": {"created", "deleted": "<hex>", "frame", "objects", "pairs",
                           "pairs_digest": "<decimal string>"}
                       or {"error": {"code", "field", "index"}}
                       or {"same_as_step": K}}, ...],
     "final_pairs": "<hex>"}

``{"same_as_step": K}``: a writer's frame with a seq it already applied (step K, same writer and seq),
answered with step K's very Delta (its serialized bytes equal) and not applied again.

How the expected values are made:

* deltas, counters and final pairs: the in-process engine (``sapcore.World``), each step checked against
  the brute-force oracle of tests/naive.py (same created/deleted/pairs, or the generator fails);
  ``pairs_digest`` is ``sapgrid.layout.pairs_digest`` of the pairs after the step;
* errors: what a real server answers (code, field, index of the StreamFramesResponse.error), which must
  equal the value the scenario documents (the contract's: INVALID_ARGUMENT naming the entry, index -1
  for a byte length, FAILED_PRECONDITION for boxes of the other dims), or the generator fails;
* writers' steps: the exactly-once rules (``WriterOracle``) say which steps are duplicates (documented
  ``same_as``, and the server's answer must be the repeated step's Delta byte for byte), which are a
  gap or an old seq (documented FAILED_PRECONDITION) and which a bad writer or seq 0 (INVALID_ARGUMENT).

    python conformance/generate.py              # writes conformance/vectors/ (starts a server in process)
    python conformance/generate.py --check      # exit 1 if the committed files differ from the output
    python conformance/generate.py --server HOST:PORT   # ask that server for the errors instead

Needs the server extra (``pip install -e '.[server,test]'``) and tests/naive.py.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VECTORS = Path(__file__).resolve().parent / "vectors"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive import NaiveWorld, array_to_pairs  # noqa: E402  (tests/naive.py: the brute-force oracle)

from sapgrid.layout import F32, U32, U64, pairs_digest, to_bytes  # noqa: E402

INVALID_ARGUMENT, FAILED_PRECONDITION = 3, 9
BULK_FIELDS = ("remove_ids", "add_ids", "add_boxes", "add_category", "add_mask", "add_static",
               "update_ids", "update_boxes")
FRAME_KEYS = ("seq", "writer") + BULK_FIELDS
HIGH = 1 << 63


@dataclass
class Step:
    """One frame of a scenario and what the scenario documents for it: applied (error and same_as
    None), refused with ``error`` (code, field, index), or a duplicate answered like step ``same_as``."""

    fields: dict
    seq: int
    writer: str
    error: tuple | None
    same_as: int | None


class Scenario:
    """A world and its frames, written as arrays (or raw bytes for malformed fields)."""

    def __init__(self, name: str, description: str, dims: int, bounds, cells):
        self.name, self.description = name, description
        self.world = {"dims": dims, "bounds": [float(b) for b in bounds], "cells": list(cells)}
        self.dims = dims
        self.steps: list[Step] = []

    def frame(self, *, error: tuple | None = None, raw: dict | None = None, seq: int | None = None,
              writer: str = "", same_as: int | None = None, **arrays) -> None:
        """One frame: keyword arrays as ``sapcore.World.step`` (ids as Python ints, boxes as rows),
        ``raw`` field -> bytes to send as they are, ``error`` the documented (code, field, index);
        ``seq`` (default: the step's number from 1) and ``writer`` as sent; ``same_as`` K: a writer's
        duplicate, documented as answered with the very Delta of step K."""
        if error is not None and same_as is not None:
            raise ValueError("a step is an error or a duplicate, not both")
        if same_as is not None and not 0 <= same_as < len(self.steps):
            raise ValueError(f"same_as {same_as}: not an earlier step")
        fields = {}
        for key, value in arrays.items():
            if key not in BULK_FIELDS:
                raise ValueError(f"unknown frame field {key!r}")
            if key.endswith("_ids"):
                fields[key] = to_bytes(np.array(value, dtype=np.uint64).reshape(-1), U64)
            elif key.endswith("_boxes"):
                fields[key] = to_bytes(np.array(value, dtype=np.float32).reshape(-1), F32)
            elif key == "add_static":
                fields[key] = bytes(int(x) for x in value)
            else:
                fields[key] = to_bytes(np.array(value, dtype=np.uint32).reshape(-1), U32)
        for key, value in (raw or {}).items():
            if key not in BULK_FIELDS:
                raise ValueError(f"unknown frame field {key!r}")
            fields[key] = bytes(value)
        self.steps.append(Step(fields, len(self.steps) + 1 if seq is None else int(seq), writer, error, same_as))


# ---- the scenarios ------------------------------------------------------------------------------

def scenario_basic_2d() -> Scenario:
    s = Scenario("basic-2d", "adds, updates and removes in a 2D world; an empty frame", 2, (0, 0, 100, 100), (4, 4))
    s.frame(add_ids=[1, 2, 3], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3], [9, 9, 10, 10]])
    s.frame(update_ids=[2], update_boxes=[[5, 5, 6, 6]])
    s.frame(update_ids=[3, 2], update_boxes=[[5.5, 5.5, 7, 7], [1.5, 1.5, 5.75, 5.75]])
    s.frame()
    s.frame(remove_ids=[2], add_ids=[4], add_boxes=[[0, 0, 100, 100]])
    s.frame(remove_ids=[1, 3])
    return s


def scenario_touching_2d() -> Scenario:
    s = Scenario("touching-2d", "boxes that touch on an edge or a corner overlap; zero-size boxes; a gap of one "
                 "float32 step does not overlap; boxes on cell borders and outside the bounds (the grid wraps)",
                 2, (0, 0, 64, 64), (4, 4))
    step = float(np.nextafter(np.float32(16), np.float32(32)))  # the float32 just above 16
    s.frame(add_ids=[10, 11, 12, 13, 14, 15, 16],
            add_boxes=[[0, 0, 16, 16],        # 10
                       [16, 0, 32, 16],       # 11: shares an edge with 10 (x = 16, on a cell border)
                       [16, 16, 20, 20],      # 12: shares a corner with 10, an edge with 11
                       [step, 2, 20, 8],      # 13: one float32 step right of 10's edge x = 16: pairs 11 only
                       [8, 8, 8, 8],          # 14: a point inside 10
                       [70, 70, 80, 80],      # 15: outside the bounds
                       [-16, -16, 0, 0]])     # 16: outside the bounds, corner on 10's corner
    s.frame(update_ids=[15], update_boxes=[[64, 64, 70, 70]])
    s.frame(update_ids=[14, 16], update_boxes=[[16, 16, 16, 16], [134, 134, 140, 140]])
    s.frame(update_ids=[13], update_boxes=[[16, 2, 20, 8]])                   # now on 10's edge: a pair
    return s


def scenario_filters_2d() -> Scenario:
    s = Scenario("filters-2d", "category/mask filters and static objects (two statics never pair)",
                 2, (0, 0, 100, 100), (2, 2))
    s.frame(add_ids=[1, 2, 3, 4, 5, 6],
            add_boxes=[[0, 0, 10, 10]] * 6,
            add_category=[0x1, 0x2, 0x4, 0x1, 0xFFFFFFFF, 0x1],
            add_mask=[0x2, 0x1, 0x4, 0xFFFFFFFF, 0x0, 0xFFFFFFFF],
            add_static=[0, 0, 0, 1, 0, 1])
    s.frame(update_ids=[3, 6], update_boxes=[[50, 50, 60, 60], [55, 55, 70, 70]])
    s.frame(add_ids=[7, 8], add_boxes=[[52, 52, 58, 58], [0, 0, 5, 5]], add_static=[1, 1])
    s.frame(update_ids=[4], update_boxes=[[50, 50, 51, 51]], remove_ids=[1])
    return s


def scenario_big_ids() -> Scenario:
    s = Scenario("big-ids", "ids 0, 2^63 and above (up to 2^64-1): ordered as unsigned 64-bit numbers",
                 2, (0, 0, 100, 100), (4, 4))
    ids = [0, HIGH - 1, HIGH, HIGH + 1, (1 << 64) - 1, 0x8000_0001_0000_0000]
    s.frame(add_ids=ids, add_boxes=[[0, 0, 10, 10], [5, 5, 15, 15], [9, 9, 20, 20],
                                    [60, 60, 70, 70], [0, 0, 100, 100], [65, 0, 70, 5]])
    s.frame(update_ids=[(1 << 64) - 1, HIGH], update_boxes=[[0, 0, 1, 1], [69, 69, 80, 80]])
    s.frame(remove_ids=[0, HIGH + 1])
    return s


def scenario_create_and_delete() -> Scenario:
    s = Scenario("create-and-delete", "frames that create and delete pairs at once (removes, moves and adds in "
                 "one frame)", 2, (0, 0, 100, 100), (4, 4))
    s.frame(add_ids=[1, 2, 3, 4], add_boxes=[[0, 0, 10, 10], [5, 5, 15, 15], [40, 40, 50, 50], [80, 80, 90, 90]])
    s.frame(update_ids=[2], update_boxes=[[45, 45, 55, 55]])
    s.frame(remove_ids=[3], update_ids=[4], update_boxes=[[8, 8, 9, 9]], add_ids=[5], add_boxes=[[50, 50, 60, 60]])
    s.frame(remove_ids=[1, 2, 4, 5], add_ids=[6, 7], add_boxes=[[0, 0, 1, 1], [1, 1, 2, 2]])
    return s


def _random_scenario(name: str, description: str, dims: int, cells, objects: int, frames: int,
                     seed: int, extent: float) -> Scenario:
    """Moving boxes on a 0.25 lattice (exact float32, so touching happens), some spanning cells, some
    outside the bounds, a few added and removed each frame; half the ids above 2^63."""
    size = 100.0
    s = Scenario(name, description, dims, (0,) * dims + (size,) * dims, cells)
    r = random.Random(seed)   # only r.random() is used: its sequence is the one Python keeps across versions

    def uniform(a, b):
        return a + (b - a) * r.random()

    def choice(values):
        return values[int(r.random() * len(values))]

    def sample(values, k):
        return sorted(values, key=lambda _: r.random())[:k]

    def box():
        lo = [round(uniform(-10, size + 5) * 4) / 4 for _ in range(dims)]
        ext = [round(uniform(0, extent) * 4) / 4 for _ in range(dims)]
        return lo + [a + e for a, e in zip(lo, ext)]

    def new_id(k):
        return HIGH + 7919 * k if k % 2 else 1000 + k

    live, counter = [], 0
    ids, boxes = [], []
    for _ in range(objects):
        ids.append(new_id(counter))
        boxes.append(box())
        counter += 1
    s.frame(add_ids=ids, add_boxes=boxes)
    live = list(ids)
    for _ in range(frames - 1):
        moved = sample(live, len(live) // 3)
        removed = sample([x for x in live if x not in moved], 2)
        added = [new_id(counter + i) for i in range(3)]
        counter += 3
        s.frame(remove_ids=removed, update_ids=moved, update_boxes=[box() for _ in moved],
                add_ids=added, add_boxes=[box() for _ in added],
                add_category=[choice([1, 3, 0xFFFFFFFF]) for _ in added],
                add_mask=[choice([1, 2, 0xFFFFFFFF]) for _ in added],
                add_static=[choice([0, 0, 1]) for _ in added])
        live = [x for x in live if x not in removed] + added
    return s


def scenario_moving_2d() -> Scenario:
    return _random_scenario("moving-2d", "60 moving boxes in a 4x4 grid, 3 added and 2 removed a frame (seeded)",
                            2, (4, 4), 60, 16, seed=2, extent=14)


def scenario_moving_3d() -> Scenario:
    return _random_scenario("moving-3d", "50 moving boxes in a 3D 3x3x2 grid, 3 added and 2 removed a frame (seeded)",
                            3, (3, 3, 2), 50, 14, seed=3, extent=30)


def scenario_errors_2d() -> Scenario:
    s = Scenario("errors-2d", "rejected frames of a 2D world: each is answered with its code, field and index "
                 "(-1: the field's byte length), and the world is unchanged (the next frame's counters show it)",
                 2, (0, 0, 100, 100), (4, 4))
    ia = INVALID_ARGUMENT
    s.frame(add_ids=[1, 2, 3], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3], [9, 9, 10, 10]])
    s.frame(add_ids=[4, 5, 6], add_boxes=[[0, 0, 1, 1], [0, 0, 1, 1], [5, 0, 4, 1]], error=(ia, "add_boxes", 2))
    s.frame(add_ids=[4, 5], add_boxes=[[0, 0, 1, 1], [0, 3, 1, 2]], error=(ia, "add_boxes", 1))
    s.frame(update_ids=[1, 2], update_boxes=[[0, 0, 1, 1], [0, float("nan"), 1, 1]], error=(ia, "update_boxes", 1))
    s.frame(add_ids=[4], add_boxes=[[0, 0, float("inf"), 1]], error=(ia, "add_boxes", 0))
    s.frame(add_ids=[4, 5, 4], add_boxes=[[0, 0, 1, 1]] * 3, error=(ia, "add_ids", 2))
    s.frame(update_ids=[1, 7], update_boxes=[[0, 0, 1, 1]] * 2, error=(ia, "update_ids", 1))
    s.frame(remove_ids=[3, 8], error=(ia, "remove_ids", 1))
    s.frame(add_ids=[4, 2], add_boxes=[[0, 0, 1, 1]] * 2, error=(ia, "add_ids", 1))
    s.frame(raw={"add_ids": b"\x04\x00\x00\x00\x00\x00\x00"}, error=(ia, "add_ids", -1))
    s.frame(add_ids=[4], raw={"add_boxes": b"\x00" * 12}, error=(ia, "add_boxes", -1))
    s.frame(add_ids=[4, 5], add_boxes=[[0, 0, 1, 1]] * 2, add_category=[1], error=(ia, "add_category", -1))
    s.frame(add_ids=[4], add_boxes=[[0, 0, 1, 1]], add_static=[2], error=(ia, "add_static", 0))
    s.frame(raw={"remove_ids": b"\x01" * 12}, error=(ia, "remove_ids", -1))
    s.frame(add_ids=[4, 5], add_boxes=[[0, 0, 0, 1, 1, 1]] * 2, error=(FAILED_PRECONDITION, "add_boxes", -1))
    s.frame(update_ids=[1], update_boxes=[[0, 0, 0, 1, 1, 1]], error=(FAILED_PRECONDITION, "update_boxes", -1))
    s.frame(update_ids=[1], update_boxes=[[5, 5, 6, 6]], add_ids=[4], add_boxes=[[5.5, 5.5, 9, 9]])
    s.frame(remove_ids=[2], update_ids=[2], update_boxes=[[0, 0, 1, 1]], error=(ia, "update_ids", 0))
    s.frame(remove_ids=[4])
    return s


def scenario_errors_3d() -> Scenario:
    s = Scenario("errors-3d", "rejected frames of a 3D world (2D boxes: FAILED_PRECONDITION; min > max on the "
                 "z axis; a coordinate beyond the world's limit), then a good frame", 3, (0, 0, 0, 10, 10, 10), (2, 2, 2))
    ia = INVALID_ARGUMENT
    s.frame(add_ids=[HIGH, 1], add_boxes=[[0, 0, 0, 5, 5, 5], [5, 5, 5, 6, 6, 6]])
    s.frame(add_ids=[2], add_boxes=[[0, 0, 1, 1]], error=(FAILED_PRECONDITION, "add_boxes", -1))
    s.frame(add_ids=[2, 3], add_boxes=[[0, 0, 0, 1, 1, 1], [0, 0, 2, 1, 1, 1]], error=(ia, "add_boxes", 1))
    s.frame(update_ids=[1], update_boxes=[[0, 0, 0, 1e16, 1, 1]], error=(ia, "update_boxes", 0))
    s.frame(add_ids=[HIGH], add_boxes=[[0, 0, 0, 1, 1, 1]], error=(ia, "add_ids", 0))
    s.frame(update_ids=[HIGH], update_boxes=[[6, 6, 6, 7, 7, 7]], add_ids=[2], add_boxes=[[6, 6, 6.5, 8, 8, 8]])
    return s


def scenario_writers_2d() -> Scenario:
    s = Scenario("writers-2d", "exactly-once frames: a writer's frames applied in its seq order; a seq it already "
                 "applied answered with the very Delta of its first answer (content not looked at, world unchanged, "
                 "not counted as a frame); a refused frame takes no seq; frames without a writer in between; a "
                 "second writer starting at seq 1000", 2, (0, 0, 100, 100), (4, 4))
    ia = INVALID_ARGUMENT
    s.frame(writer="m1", seq=1, add_ids=[1, 2, 3], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3], [9, 9, 10, 10]])  # 0
    s.frame(writer="m1", seq=2, update_ids=[2], update_boxes=[[8, 8, 9.5, 9.5]])                          # 1
    s.frame(writer="m1", seq=2, update_ids=[2], update_boxes=[[8, 8, 9.5, 9.5]], same_as=1)               # 2
    s.frame(writer="m1", seq=1, remove_ids=[1, 2, 3], same_as=0)       # 3: another content, the first answer
    s.frame(writer="m1", seq=3, update_ids=[1], update_boxes=[[5, 5, 4, 6]], error=(ia, "update_boxes", 0))
    s.frame(writer="m1", seq=3, update_ids=[1], update_boxes=[[9, 0, 12, 9]])                            # 5
    s.frame(writer="m1", seq=3, same_as=5)                                                               # 6
    s.frame(seq=3, add_ids=[4], add_boxes=[[0, 0, 100, 1]])            # 7: no writer, seq not interpreted
    s.frame(seq=3, update_ids=[4], update_boxes=[[0, 50, 100, 51]])                                      # 8
    s.frame(writer="m2", seq=1000, add_ids=[5, 6], add_boxes=[[50, 50, 60, 60], [55, 49, 56, 70]])      # 9
    s.frame(writer="m2", seq=1000, same_as=9)                                                            # 10
    s.frame(writer="m1", seq=2, same_as=1)             # 11: the world moved since, the answer did not
    s.frame(writer="m2", seq=1001, remove_ids=[4])                                                       # 12
    s.frame(writer="m1", seq=4, update_ids=[3], update_boxes=[[9, 9, 11, 11]])                           # 13
    s.frame(writer="m2", seq=1000, same_as=9)                                                            # 14
    s.frame(writer="w" * 64, seq=1, update_ids=[5], update_boxes=[[0, 0, 1, 1]])   # 15: a 64-character name
    s.frame(writer="m1", seq=5, add_ids=[7], add_boxes=[[0, 0, 0, 1, 1, 1]],                         # 16
            error=(FAILED_PRECONDITION, "add_boxes", -1))
    s.frame(writer="m1", seq=5, add_ids=[7], add_boxes=[[0, 0, 1, 1]])                                   # 17
    s.frame(writer="m1", seq=4, same_as=13)                                                              # 18
    return s


def scenario_writers_errors_2d() -> Scenario:
    s = Scenario("writers-errors-2d", "exactly-once frames refused: a gap in a writer's seqs and a seq older than "
                 "its oldest kept answer (FAILED_PRECONDITION), bad writer names and seq 0 with a writer "
                 "(INVALID_ARGUMENT); none changes the world or the writer's seq", 2, (0, 0, 100, 100), (4, 4))
    ia, fp = INVALID_ARGUMENT, FAILED_PRECONDITION
    seq_field = ("seq", -1)           # a writer's seq out of order: the frame's seq is at fault
    s.frame(writer="m1", seq=1, add_ids=[1, 2], add_boxes=[[0, 0, 2, 2], [1, 1, 3, 3]])                  # 0
    s.frame(writer="m1", seq=3, update_ids=[2], update_boxes=[[5, 5, 6, 6]], error=(fp, *seq_field))    # 1: gap
    s.frame(writer="m1", seq=2 ** 53 - 1, remove_ids=[1], error=(fp, *seq_field))   # 2: gap (a JSON-safe integer)
    s.frame(writer="m1", seq=0, remove_ids=[1], error=(ia, "seq", -1))                                 # 3
    s.frame(writer="m1 ", seq=2, remove_ids=[1], error=(ia, "writer", -1))                             # 4
    s.frame(writer="bad/name", seq=2, remove_ids=[1], error=(ia, "writer", -1))                        # 5
    s.frame(writer="w" * 65, seq=1, remove_ids=[1], error=(ia, "writer", -1))                          # 6
    s.frame(writer="m\u00e9", seq=1, remove_ids=[1], error=(ia, "writer", -1))                          # 7
    s.frame(writer="new", seq=0, remove_ids=[1], error=(ia, "seq", -1))                                # 8
    s.frame(writer="m1", seq=2, update_ids=[2], update_boxes=[[5, 5, 6, 6]])                           # 9
    s.frame(writer="late", seq=500, add_ids=[3], add_boxes=[[5, 5, 7, 7]])                             # 10
    s.frame(writer="late", seq=499, remove_ids=[3], error=(fp, *seq_field))    # 11: older than kept (from 500)
    s.frame(writer="late", seq=1, remove_ids=[3], error=(fp, *seq_field))                              # 12
    s.frame(writer="late", seq=502, remove_ids=[3], error=(fp, *seq_field))                            # 13: gap
    s.frame(writer="late", seq=501, remove_ids=[3])                                                    # 14
    s.frame(writer="late", seq=500, same_as=10)                                                        # 15
    return s


SCENARIOS = (scenario_basic_2d, scenario_touching_2d, scenario_filters_2d, scenario_big_ids,
             scenario_create_and_delete, scenario_moving_2d, scenario_moving_3d, scenario_errors_2d,
             scenario_errors_3d, scenario_writers_2d, scenario_writers_errors_2d)


# ---- the writers' oracle ------------------------------------------------------------------------

class WriterOracle:
    """The contract's exactly-once rules (frame.proto, Frame.writer), written out plainly: what a step
    with a writer gets before its content is looked at. Scenarios stay under the 256 answers a world keeps
    per writer, so every applied seq of a writer from its first is still answered."""

    def __init__(self):
        self.applied: dict[str, dict[int, int]] = {}     # writer -> seq -> step that applied it

    def before(self, writer: str, seq: int) -> tuple[str, int | None]:
        """("apply", None), ("duplicate", K), ("invalid", None) or ("conflict", None)."""
        if not writer:
            return "apply", None
        if not (1 <= len(writer) <= 64 and all(c.isascii() and (c.isalnum() or c in "_.-") for c in writer)):
            return "invalid", None
        if seq == 0:
            return "invalid", None
        seqs = self.applied.get(writer)
        if not seqs:
            return "apply", None
        last = max(seqs)
        if seq == last + 1:
            return "apply", None
        if seq in seqs:
            return "duplicate", seqs[seq]
        return "conflict", None          # a gap, or older than the first answer kept

    def applied_at(self, writer: str, seq: int, step: int) -> None:
        if writer:
            self.applied.setdefault(writer, {})[seq] = step


# ---- expected values ----------------------------------------------------------------------------

def _engine_arrays(fields: dict, dims: int) -> dict:
    """The keyword arrays of World.step for a well-formed frame's bytes (as the server decodes them)."""
    n_add = len(fields.get("add_ids", b"")) // 8
    out = {}
    for key, raw in fields.items():
        if not raw:
            continue
        if key.endswith("_ids"):
            out[key] = np.frombuffer(raw, U64)
        elif key.endswith("_boxes"):
            out[key] = np.frombuffer(raw, F32).reshape(-1, 2 * dims)
        elif key == "add_static":
            out[key] = np.frombuffer(raw, np.uint8).astype(bool)
        else:
            out[key] = np.frombuffer(raw, U32)
    assert n_add == len(out.get("add_ids", ()))
    return out


def _pairs_hex(pairs) -> str:
    return to_bytes(np.asarray(pairs, np.uint64).reshape(-1, 2), U64).hex()


def build(scenario: Scenario, answers: list) -> dict:
    """The vector of a scenario: engine deltas checked against the oracle, writers' steps against the
    writers' oracle, and the server's answers (``answers``: per step, (code, field, index) of an error
    or the serialized Delta) checked against the documented ones: the same errors, and a duplicate's
    Delta byte for byte the one of the step it repeats."""
    from sapcore import World, WorldConfig

    w = scenario.world
    world = World(WorldConfig(dims=w["dims"], bounds=tuple(w["bounds"]), cells=tuple(w["cells"]), threads=1))
    oracle = NaiveWorld(w["dims"])
    writers = WriterOracle()
    steps = []
    for i, (step, answered) in enumerate(zip(scenario.steps, answers, strict=True)):
        frame = {"seq": step.seq, "writer": step.writer}
        frame.update({key: step.fields.get(key, b"").hex() for key in BULK_FIELDS})
        where = f"{scenario.name} step {i}"
        error = step.error
        rule, repeats = writers.before(step.writer, step.seq)
        if (rule == "duplicate") != (step.same_as is not None) or (rule == "duplicate" and repeats != step.same_as):
            raise SystemExit(f"{where}: the writers' rules make it {rule} {repeats}, the scenario says "
                             f"same_as {step.same_as}")
        if rule == "invalid" and (error is None or error[0] != INVALID_ARGUMENT):
            raise SystemExit(f"{where}: a bad writer or seq 0 must be documented INVALID_ARGUMENT, not {error}")
        if rule == "conflict" and (error is None or error[0] != FAILED_PRECONDITION):
            raise SystemExit(f"{where}: a writer's seq out of order must be documented FAILED_PRECONDITION, "
                             f"not {error}")
        if step.same_as is not None:
            first = answers[step.same_as]
            if not isinstance(answered, bytes) or answered != first:
                raise SystemExit(f"{where}: the server's answer {answered!r:.120} is not the Delta of step "
                                 f"{step.same_as} byte for byte")
            steps.append({"frame": frame, "expect": {"same_as_step": step.same_as}})
            continue
        if error is not None:
            if answered != error:
                raise SystemExit(f"{where}: the server answers {answered!r:.120}, the documented error is {error}")
            steps.append({"frame": frame, "expect": {"error": {"code": error[0], "field": error[1],
                                                               "index": error[2]}}})
            continue
        if not isinstance(answered, bytes):
            raise SystemExit(f"{where}: the server refused a good frame: {answered}")
        arrays = _engine_arrays(step.fields, w["dims"])
        delta = world.step(**arrays)
        ref = oracle.step(**arrays)
        world.validate()
        writers.applied_at(step.writer, step.seq, i)
        for what, got, want in (("created", delta.created, ref.created), ("deleted", delta.deleted, ref.deleted),
                                ("pairs", world.pairs(), oracle.pairs())):
            if array_to_pairs(got) != array_to_pairs(want):
                raise SystemExit(f"{where}: the engine's {what} differ from the oracle's")
        pairs = world.pairs()
        steps.append({"frame": frame, "expect": {
            "created": _pairs_hex(delta.created), "deleted": _pairs_hex(delta.deleted), "frame": int(world.frames),
            "pairs_digest": str(pairs_digest(pairs)), "objects": int(delta.stats.objects),
            "pairs": int(delta.stats.pairs)}})
    return {"name": scenario.name, "description": scenario.description, "world": w, "steps": steps,
            "final_pairs": _pairs_hex(world.pairs())}


def server_answers(address: str, scenario: Scenario) -> list:
    """Per step, the server's answer: (code, field, index) of an error, or the Delta serialized (bytes);
    every frame sent through one StreamFrames stream to a fresh world of the scenario's configuration."""
    import grpc

    from sapgrid.v1 import frame_pb2, sapgrid_service_pb2 as pb, sapgrid_service_pb2_grpc as pb_grpc, world_pb2

    name = f"conformance-gen-{uuid.uuid4().hex[:8]}"
    w = scenario.world
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SapgridServiceStub(channel)
        stub.CreateWorld(pb.CreateWorldRequest(name=name, config=world_pb2.WorldConfig(
            dims=w["dims"], bounds=w["bounds"], cells=w["cells"], threads=1)), timeout=60)
        try:
            requests = [pb.StreamFramesRequest(frame=frame_pb2.Frame(world=name, seq=step.seq, writer=step.writer,
                                                                     **step.fields))
                        for step in scenario.steps]
            out = []
            # a long deadline: on a busy machine the first frames wait for the kernels to compile
            for resp in stub.StreamFrames(iter(requests), timeout=900):
                if resp.WhichOneof("result") == "error":
                    out.append((resp.error.code, resp.error.field, resp.error.index))
                else:
                    out.append(resp.delta.SerializeToString())
            return out
        finally:
            stub.DeleteWorld(pb.DeleteWorldRequest(name=name), timeout=60)


def render(vector: dict) -> str:
    """A vector as its file's text: one step a line, stable across runs."""
    head = {k: vector[k] for k in ("name", "description", "world")}
    lines = ["{" + json.dumps(head)[1:-1] + ","]
    lines.append(' "steps": [')
    lines.append(",\n".join("  " + json.dumps(step) for step in vector["steps"]))
    lines.append(" ],")
    lines.append(f' "final_pairs": {json.dumps(vector["final_pairs"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def generate(address: str) -> dict[str, str]:
    """file name -> text of every vector, the errors asked of the server at ``address``."""
    out = {}
    for make in SCENARIOS:
        scenario = make()
        vector = build(scenario, server_answers(address, scenario))
        out[f"{scenario.name}.json"] = render(vector)
    return out


def stale(files: dict[str, str], directory: Path = VECTORS) -> list[str]:
    """Names of the vector files that differ from ``files`` (missing, changed, or not generated)."""
    on_disk = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    bad = sorted(name for name, text in files.items()
                 if not (directory / name).is_file() or (directory / name).read_text() != text)
    return bad + sorted(on_disk - set(files))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    ap.add_argument("--server", default="", help="HOST:PORT of a sapgrid server (default: start one in process)")
    ap.add_argument("--out", type=Path, default=VECTORS, help="directory of the vectors")
    args = ap.parse_args(argv)
    app = None
    address = args.server
    if not address:
        from sapgrid.server.app import build_server
        from sapgrid.server.config import from_args

        app = build_server(from_args(env={}, listen="127.0.0.1:0", metrics_port=-1, default_world=""))
        app.start()
        address = app.address
    try:
        files = generate(address)
    finally:
        if app is not None:
            app.stop(grace=1.0)
    if args.check:
        bad = stale(files, args.out)
        if bad:
            print("stale conformance vectors (run python conformance/generate.py): " + ", ".join(bad))
            return 1
        print(f"conformance vectors up to date ({len(files)} files)")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.json"):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        (args.out / name).write_text(text)
    print(f"wrote {len(files)} vectors to {args.out} ({sum(len(t) for t in files.values())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
