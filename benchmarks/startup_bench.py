"""Start-up and replacement times of a stack; same as `tessera bench --suite startup`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "startup", *sys.argv[1:]]))
