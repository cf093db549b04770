"""Soak: minutes of mixed traffic; does memory stay flat and every cache within budget; same as `tessera bench --suite soak`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "soak", *sys.argv[1:]]))
