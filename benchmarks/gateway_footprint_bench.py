"""The gateway process's start time and peak RSS; same as `tessera bench --suite gateway_footprint`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "gateway_footprint", *sys.argv[1:]]))
