"""Where a stack's memory goes, per process; same as `tessera bench --suite stack_memory`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "stack_memory", *sys.argv[1:]]))
