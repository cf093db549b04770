"""The engine against transformers generate (TTFT, decode tokens/s); same as `tessera bench --suite engine`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "engine", *sys.argv[1:]]))
