"""sapgrid: a networked broadphase service.

This package holds the wire contract's generated code (``sapgrid.v1``), shared by the server and the
clients. The Python client is ``sapgrid.client``, the server ``sapgrid.server``, the ``sapgrid``
command and its tools ``sapgrid.tools``; the engine is the separate package ``sapcore``.
"""
__version__ = "0.1.0"

DEFAULT_ADDRESS = "127.0.0.1:50051"   # where a server listens and a client connects by default
