"""Test certificates made with the openssl command (the `cryptography` package is not installed
here): a self-signed CA and one certificate it signs, for server and client use."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(command: str, cwd: Path) -> None:
    subprocess.run(["openssl", *command.split()], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path, *, dns_name: str = "tessera-internal", ip: str | None = None) -> None:
    """ca.pem (and ca.key), and node.pem / node.key for ``dns_name`` (and ``ip``, when given)."""
    _openssl("req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca", directory)
    _openssl(f"req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /CN={dns_name}", directory)
    names = f"DNS:{dns_name}" + (f",IP:{ip}" if ip else "")
    (directory / "ext.cnf").write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out node.pem -days 1 -extfile ext.cnf", directory)
