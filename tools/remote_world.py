"""A world on a sapgrid server with the interface of ``sapcore.World`` (step / pairs / query), so replay
and bench code runs against a local or a remote world unchanged.

    RemoteWorld.connect(address: str, config: sapcore.WorldConfig, name: str | None = None, *,
                        create=True) -> RemoteWorld

creates the world ``name`` (default: a unique ``remote-…`` name) on the server at ``address``
("HOST:PORT") unless ``create=False`` (then the world must exist and is not deleted). Frames travel over
one bidirectional stream; refused frames raise ``sapcore.FrameError`` / ``CapacityError`` as a local
world does. ``close()`` deletes the world it created and closes the connection; it is a context manager.
"""
from __future__ import annotations

import threading
import uuid

import numpy as np

from sapcore.errors import CapacityError, FrameError
from sapgrid.client import Client, FrameStream, RemoteDelta, WorldInfo
from sapgrid.client.errors import FailedPrecondition, InvalidArgument, ResourceExhausted


def _reason(err) -> str:
    """The server's message without the "field[index]: " it starts with (FrameError adds it back)."""
    where = f"{err.field}[{err.index}]: " if err.index >= 0 else f"{err.field}: "
    return err.message[len(where):] if err.field and err.message.startswith(where) else err.message


class RemoteWorld:
    """A world on a sapgrid server with the interface of ``sapcore.World``; see the module docstring."""

    def __init__(self, client: Client, name: str, config, *, owned: bool):
        self.client = client
        self.name = name
        self.config = config
        self._owned = owned
        self.writer = f"w-{uuid.uuid4().hex[:12]}"
        self._stream: FrameStream | None = None
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, address: str, config, name: str | None = None, *, create: bool = True,
                expected_objects: int = 0, timeout: float | None = 60.0) -> "RemoteWorld":
        client = Client(address, timeout=timeout)
        name = name or f"remote-{uuid.uuid4().hex[:12]}"
        try:
            if create:
                info = client.create_world(name, config, expected_objects=expected_objects)
            else:
                info = client.get_world(name)
        except BaseException:
            client.close()
            raise
        return cls(client, name, info.config, owned=create)

    # ---- the sapcore.World interface -----------------------------------------------------------
    def step(self, remove_ids=None, add_ids=None, add_boxes=None, add_category=None, add_mask=None, add_static=None,
             update_ids=None, update_boxes=None) -> RemoteDelta:
        """Apply one frame over the world's stream; returns its delta (created, deleted, stats)."""
        with self._lock:
            if self._stream is None:       # exactly-once frames that survive a broken connection
                self._stream = self.client.stream(self.name, writer=self.writer, resume=True)
            try:
                return self._stream.step(remove_ids=remove_ids, add_ids=add_ids, add_boxes=add_boxes,
                                         add_category=add_category, add_mask=add_mask, add_static=add_static,
                                         update_ids=update_ids, update_boxes=update_boxes)
            except (InvalidArgument, FailedPrecondition) as err:
                raise FrameError(err.field, err.index, _reason(err)) from err
            except ResourceExhausted as err:
                raise CapacityError(err.field or "frame", _reason(err)) from err

    def pairs(self) -> np.ndarray:
        return self.client.pairs(self.name)

    def query(self, region) -> np.ndarray:
        return self.client.query(self.name, region)

    def ids(self) -> np.ndarray:
        """All live ids, sorted (a query over the whole coordinate range)."""
        lim = float(self.config.coord_limit)
        return self.client.query(self.name, [-lim] * self.config.dims + [lim] * self.config.dims)

    def info(self) -> WorldInfo:
        return self.client.get_world(self.name)

    @property
    def object_count(self) -> int:
        return self.info().objects

    @property
    def pair_count(self) -> int:
        return self.info().pairs

    @property
    def frames(self) -> int:
        return self.info().frames

    def close(self) -> None:
        """Close the stream, delete the world if this object created it, close the connection."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        try:
            if self._owned:
                self.client.delete_world(self.name)
                self._owned = False
        finally:
            self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
