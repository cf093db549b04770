"""Tessera's version: the installed package's, or, for a checkout run without installing it
(``PYTHONPATH=. python -m services.cli.main``, as on a machine that only has the source), the
checkout's pyproject.toml, so that no command needs the package's metadata to start."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def tessera_version(pyproject: Path = PYPROJECT) -> str:
    try:
        return importlib.metadata.version("tessera")
    except importlib.metadata.PackageNotFoundError:
        with open(pyproject, "rb") as file:
            return tomllib.load(file)["project"]["version"]
