"""Elasticity: node join time, and what a node loss costs, per role; same as `tessera bench --suite elastic`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "elastic", *sys.argv[1:]]))
