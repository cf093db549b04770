"""Many concurrent streaming clients against one endpoint (connection errors, TTFT); same as `tessera bench --suite concurrency`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "concurrency", *sys.argv[1:]]))
