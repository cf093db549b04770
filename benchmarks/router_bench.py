"""Router decision time for a long prompt against an embedded Valkey; same as `tessera bench --suite router`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "router", *sys.argv[1:]]))
