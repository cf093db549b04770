"""The version the gateway reports: the installed package's, or the checkout's pyproject.toml
where the package was never installed."""

from __future__ import annotations

import importlib.metadata
import tomllib

from shared.version import PYPROJECT, tessera_version


def _checkout_version() -> str:
    return tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def test_the_installed_version_is_the_checkouts():
    assert tessera_version() == _checkout_version()


def test_a_checkout_never_installed_reads_its_pyproject(monkeypatch, tmp_path):
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "tessera"\nversion = "9.8.7"\n')
    assert tessera_version(pyproject) == "9.8.7"
    assert tessera_version() == _checkout_version()
