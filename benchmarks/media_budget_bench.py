"""The media budget under a burst of large images, with and without it; same as `tessera bench --suite media_budget`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "media_budget", *sys.argv[1:]]))
