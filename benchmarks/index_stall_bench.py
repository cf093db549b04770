"""A stalled index under load: streams and new requests while Valkey is stopped; same as `tessera bench --suite index_stall`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "index_stall", *sys.argv[1:]]))
