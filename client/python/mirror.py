"""A client's own check of a world's pairs: ``verify=True`` on a frame stream.

``PairMirror`` keeps the digest of the pairs it has seen (``sapgrid.layout.pairs_digest``, the formula of
Delta.pairs_digest in the contract), starting from the world's pairs when the stream opened and moved by
every delta's created/deleted in O(delta). A delta whose ``pairs_digest`` differs from the mirror's, or
that does not follow the mirror's frame, raises ``DataLoss``: the client's view of the pairs and the
server's have parted, so the caller stops before acting on wrong pairs.

The mirror follows the world frame by frame, so a verified stream must be the world's only writer while
it runs (a frame of another writer in between is reported, not silently absorbed).
"""
from __future__ import annotations

from sapgrid.layout import digest_step, pairs_digest

from .codec import RemoteDelta
from .errors import DataLoss


class PairMirror:
    """The digest of a world's pairs as the deltas of one stream build it; see the module docstring."""

    def __init__(self, pairs, frame: int):
        self.digest = pairs_digest(pairs)
        self.frame = frame

    def apply(self, delta: RemoteDelta) -> RemoteDelta:
        if delta.frame <= self.frame:
            return delta                  # an earlier frame answered again (a duplicate): already counted
        if delta.frame != self.frame + 1:
            raise DataLoss(f"world {delta.world!r}: frame {delta.frame} follows frame {self.frame} of this "
                           f"stream's mirror: another writer changed the world (verify needs the stream to "
                           f"be the world's only writer)")
        digest = digest_step(self.digest, delta.created, delta.deleted)
        if digest != delta.pairs_digest:
            raise DataLoss(f"world {delta.world!r}: frame {delta.frame}: the server's pair digest "
                           f"{delta.pairs_digest:#018x} differs from this client's mirror {digest:#018x}")
        self.digest, self.frame = digest, delta.frame
        return delta


__all__ = ["PairMirror"]
