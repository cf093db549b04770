"""Outputs handed from an engine thread to the loop, per call against per burst; same as `tessera bench --suite detokenize`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "loop_handoff", *sys.argv[1:]]))
