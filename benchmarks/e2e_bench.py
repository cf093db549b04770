"""End-to-end latency, the stack over HTTP against the single-process engine; same as `tessera bench --suite e2e`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "e2e", *sys.argv[1:]]))
