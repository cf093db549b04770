"""Decode step time with LoRA adapters in the batch against the base model; same as `tessera bench --suite lora_step`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "lora_step", *sys.argv[1:]]))
