"""A cluster simulator: the real router and index with modelled compute; same as `tessera bench --suite simulate`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "simulate", *sys.argv[1:]]))
