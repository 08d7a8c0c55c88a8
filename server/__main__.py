"""``python -m sapgrid.server [flags]``: same as ``sapgrid serve``."""
import sys

from .main import main

sys.exit(main(sys.argv[1:]))
