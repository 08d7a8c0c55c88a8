"""The sapgrid contract: the .proto files of sapgrid.v1 and the buf module, shipped as package data.

Read them with ``importlib.resources.files("sapgrid.proto") / "sapgrid" / "v1"``."""
