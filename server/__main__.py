"""``python -m sapgrid.server [flags]``: same as ``sapgrid serve``."""
import sys

from sapgrid.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
