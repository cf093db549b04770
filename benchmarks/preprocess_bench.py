"""Preprocessing time per image, cold and on a processor-cache hit, and mm_hash GB/s; same as `tessera bench --suite preprocess`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "preprocess", *sys.argv[1:]]))
