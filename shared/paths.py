"""Where Tessera keeps generated state on disk."""

from __future__ import annotations

import os
from pathlib import Path

TESSERA_HOME_ENV = "TESSERA_HOME"


def tessera_home() -> Path:
    """``$TESSERA_HOME``, or ``~/.cache/tessera``."""
    configured = os.environ.get(TESSERA_HOME_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tessera"


def builtin_models_dir() -> Path:
    return tessera_home() / "models"
