"""sapgrid: a networked broadphase service. Client library: ``sapgrid.client``; CLI: ``sapgrid.cli``.

The generated wire code is ``sapgrid.v1``; the server is ``sapgrid.server``.
"""
__version__ = "0.1.0"
