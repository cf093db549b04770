"""Decode step, vision tower and exactness on one device (CPU or CUDA); same as `tessera bench --suite compute`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "compute", *sys.argv[1:]]))
