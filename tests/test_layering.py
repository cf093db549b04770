"""Layers point one way. From the bottom: shared/ and services/transport/ (and kernels/) know
nothing of what runs on them; the engine and the preprocessing library know no role; the roles
(encoder, prefill, decode, preprocess servers) know no gateway, router or stack. An import that
points upward fails here, with the file and line."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("encoder", "prefill", "decode")
ABOVE_TRANSPORT = ("models", "engine", "gateway", "router", "stack", "cli", "preprocess", *ROLES)
# package (a path under the repository) -> module prefixes it must never import
FORBIDDEN = {
    "shared": tuple(f"services.{p}" for p in ABOVE_TRANSPORT) + ("services.transport", "kernels"),
    "kernels": ("services",),
    "services/transport": tuple(f"services.{p}" for p in ABOVE_TRANSPORT),
    # Model families: config, processor, towers and decoders; they know no engine and no role.
    "services/models": tuple(f"services.{p}" for p in ("engine", "preprocess", "gateway", "router", "stack", "cli", *ROLES)),
    "services/engine": tuple(f"services.{p}" for p in ("gateway", "router", "stack", "cli", *ROLES)),
    "services/preprocess": tuple(f"services.{p}" for p in ("engine", "gateway", "router", "stack", "cli", *ROLES)),
    "services/router": tuple(f"services.{p}" for p in ("gateway", "stack", "cli", *ROLES)),
}
# The attention interface is imported by its backends; only kernels/selector.py imports them.
KERNEL_BACKENDS = ("kernels.torch_backend", "kernels.flashinfer_backend")


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imports(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_import(package):
    assert violations(package, FORBIDDEN[package]) == []


def test_only_the_selector_imports_attention_backends():
    found = [
        v
        for p in sorted((ROOT / "kernels").glob("*.py"))
        if p.name != "selector.py"
        for v in (f"{p.name}:{line} {m}" for line, m in imports(p) if m in KERNEL_BACKENDS)
    ]
    assert found == []


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    package = tmp_path / "shared"
    package.mkdir()
    (package / "bad.py").write_text("from services.engine.engine import Engine\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("shared", FORBIDDEN["shared"]) == ["shared/bad.py:1 imports services.engine.engine"]
