"""KV bytes per request, sliding-window layers windowed against whole; same as `tessera bench --suite kv_layout`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "kv_layout", *sys.argv[1:]]))
