"""Fill numba's on-disk kernel cache (NUMBA_CACHE_DIR) so a fresh server's start does not compile.

sapcore's kernels are compiled on first use and cached on disk (``cache=True``). A server loads the
kernels its frames, queries and snapshots need as it starts (``sapgrid.server.kernels``: scratch worlds of
2 and 3 dims driven through every kind of frame, with the read-only arrays the service decodes from the
wire; a test checks that a varied client workload needs no other kernel): from an empty cache that takes
~8 minutes on 2 cores, from a filled one about a second. This script runs that same load, without a
server, so an image's first start only reads the cache.

The cache is keyed by the CPU it was compiled for: on a machine with another CPU model the kernels
are compiled again on first use (and cached again if the directory is writable).

    NUMBA_CACHE_DIR=/var/cache/sapgrid/numba python deploy/warm_cache.py
"""
from __future__ import annotations

import logging
import sys
import time

import sapcore
from sapgrid.server import kernels


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="warm_cache: %(message)s")
    t0 = time.perf_counter()
    if not kernels.wait_all():
        print("warm_cache: loading the kernels failed (see the error above)", file=sys.stderr, flush=True)
        return 1
    # numba keys its cache by the kernels' source folder: this must be the installed sapcore the server runs.
    print(f"warm_cache: kernels of {sapcore.__file__} compiled and cached in {time.perf_counter() - t0:.1f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
