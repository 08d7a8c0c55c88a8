"""sapgrid.server: the gRPC service (config, registry, servicer, errors, metrics, app). Run: ``sapgrid serve``."""
