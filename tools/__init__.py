"""sapgrid.tools: the ``sapgrid`` command and the tools beside the libraries (demo, bench, replay, traces)."""
