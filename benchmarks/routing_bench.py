"""Routing policies (cache_aware, round_robin) on a shared-image workload; same as `tessera bench --suite routing`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "routing", *sys.argv[1:]]))
