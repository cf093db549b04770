"""Layers point one way. From the bottom: shared/ and services/transport/ (and kernels/) know
nothing of what runs on them; the engine and the preprocessing library know no role; the roles
(encoder, prefill, decode, preprocess servers) know no gateway, router or stack; nothing installed
(services/, bench and cli included) imports the lab (benchmarks/) or tests/, which may import
anything. An import that points upward fails here, with the file and line."""

from __future__ import annotations

import ast
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("encoder", "prefill", "decode")
ABOVE_TRANSPORT = ("models", "engine", "gateway", "router", "stack", "cli", "preprocess", *ROLES)
LAB = ("benchmarks", "tests")
# package (a path under the repository) -> module prefixes it must never import
FORBIDDEN = {
    "shared": (*(f"services.{p}" for p in ABOVE_TRANSPORT), "services.transport", "kernels", *LAB),
    "kernels": ("services", *LAB),
    "services/transport": tuple(f"services.{p}" for p in ABOVE_TRANSPORT),
    # Model families: config, processor, towers and decoders; they know no engine and no role.
    "services/models": tuple(f"services.{p}" for p in ("engine", "preprocess", "gateway", "router", "stack", "cli", *ROLES)),
    "services/engine": tuple(f"services.{p}" for p in ("gateway", "router", "stack", "cli", *ROLES)),
    "services/preprocess": tuple(f"services.{p}" for p in ("engine", "gateway", "router", "stack", "cli", *ROLES)),
    "services/router": tuple(f"services.{p}" for p in ("gateway", "stack", "cli", *ROLES)),
    # What users install serves requests: the lab (benchmarks/: suites, the simulator) and the
    # tests stay in a checkout. tessera bench --suite finds benchmarks/ there by name at run time.
    "services": LAB,
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


def test_the_gateway_loads_no_tensor_library():
    """The gateway runs no model: importing every gateway module leaves torch unloaded."""
    import subprocess

    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "services/gateway").rglob("*.py") if p.stem != "__init__"
    )
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_the_gateway_process_loads_no_tensor_library(tmp_path):
    """``tessera serve --role gateway`` up to its server's start: the flags, every role's settings,
    the model's resolution and the gateway's main leave torch unloaded."""
    import subprocess

    (tmp_path / "config.json").write_text('{"model_type": "qwen2_vl"}')
    code = (
        "import sys\n"
        "import services.gateway.server as server\n"
        "server.run_gateway = lambda *a, **k: print('torch' in sys.modules, k['tool_parser'])\n"
        "from services.cli.main import main\n"
        f"main(['serve', '--role', 'gateway', '--model', {str(tmp_path)!r}, '--index-url', 'redis://127.0.0.1:1'])\n"
    )
    env = {**os.environ, "TESSERA_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "hermes"]


# What would bring threads or blocking gRPC back into the gateway, which is async end to end.
BLOCKING_IN_GATEWAY = ("threading", "concurrent.futures", "queue")
BLOCKING_CALLS = (
    "to_thread",
    "run_in_executor",
    "call_soon_threadsafe",
    "insecure_channel",
    "secure_channel",
    "intercept_channel",
    "server",
)


def blocking_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [f"{path.name}:{line} imports {m}" for line, m in imports(path) if m.split(".")[0] in BLOCKING_IN_GATEWAY]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in BLOCKING_CALLS:
            owner = node.func.value
            if node.func.attr in ("server", "insecure_channel", "secure_channel", "intercept_channel"):
                if not (isinstance(owner, ast.Name) and owner.id == "grpc"):  # grpc.aio.server(...) is the async one
                    continue
            found.append(f"{path.name}:{node.lineno} calls {node.func.attr}")
    return sorted(found)


def test_the_gateway_starts_no_thread_and_dials_no_blocking_channel():
    """The gateway and its router: the router's index reads are awaited (shared/index/reader.py)."""
    paths = [*sorted((ROOT / "services/gateway").rglob("*.py")), *sorted((ROOT / "services/router").glob("*.py"))]
    assert [v for p in paths for v in blocking_uses(p)] == []


def test_the_blocking_check_catches_a_thread_and_a_blocking_channel(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import threading\nimport grpc\nasync def f(loop):\n    await asyncio.to_thread(g)\n    grpc.insecure_channel('a')\n")
    assert blocking_uses(bad) == ["bad.py:1 imports threading", "bad.py:4 calls to_thread", "bad.py:5 calls insecure_channel"]


def test_no_service_dials_a_blocking_grpc_channel():
    """One kind of gRPC everywhere, grpc.aio: tools outside an event loop run an aio call to its end
    (services/transport/node_stats.py), so no blocking channel or server is left to keep apart."""
    blocking_grpc = ("insecure_channel", "secure_channel", "intercept_channel", "server")
    found = [
        use
        for package in ("services", "shared")
        for path in sorted((ROOT / package).rglob("*.py"))
        for use in blocking_uses(path)
        if use.rpartition(" calls ")[2] in blocking_grpc
    ]
    assert found == []


def test_the_lab_and_the_tests_are_not_installed():
    import fnmatch
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert [p for p in include if fnmatch.fnmatch("benchmarks", p) or fnmatch.fnmatch("tests", p)] == []


# Small modules, small functions: past these a module holds more than one concept, or a function
# more than one step (the project's style).
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 60


def test_no_module_or_function_outgrows_its_limit():
    too_long = []
    for package in ("services", "shared", "kernels", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            # Generated protobuf code, and vLLM's own source committed as the field audit's reference.
            if "gen" in parts or any(part.startswith("vllm-") for part in parts):
                continue
            source = path.read_text()
            if (num_lines := source.count("\n")) > MAX_MODULE_LINES:
                too_long.append(f"{path.relative_to(ROOT)}: {num_lines} lines")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_long == []


def test_the_gateway_is_laid_out_in_rooms_without_mixins_or_long_modules():
    """Issue 57's layout: rooms (subfolders) of one concept each, request models without a web of
    mixins (one flat base at most per class), and no module over 300 lines."""
    gateway = ROOT / "services/gateway"
    assert {p.name for p in gateway.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= {
        "http",
        "protocol",
        "frontend",
        "pipeline",
    }
    found = []
    for path in sorted(gateway.rglob("*.py")):
        source = path.read_text()
        if source.count("\n") > 300:
            found.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and len(node.bases) > 1:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} mixes {len(node.bases)} bases")
    assert found == []


# Gateway modules a chat request's calls enter from the HTTP edge to the pipeline: 23 before the
# gateway was laid out in rooms (a15d817), 18 since. Thin modules were folded into their users;
# a new hop on this path should be a new concept, and this number says so when it grows.
MAX_CHAT_CHAIN_MODULES = 18


def test_a_chat_request_reaches_the_pipeline_through_few_gateway_modules():
    from tests.services.gateway.http.test_app import MESSAGES, FakePipeline, client_for

    entered: list[str] = []
    reached = [False]

    class Pipeline(FakePipeline):
        async def run(self, *args, **kwargs):
            reached[0] = True
            async for event in super().run(*args, **kwargs):
                yield event

    def profile(frame, event, arg) -> None:
        name = frame.f_code.co_filename
        if event == "call" and not reached[0] and "/services/gateway/" in name and name not in entered:
            entered.append(name)

    http, _ = client_for(Pipeline())
    http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})  # warm: imports, caches
    reached[0] = False
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        assert http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}).status_code == 200
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert reached[0] and 10 <= len(entered) <= MAX_CHAT_CHAIN_MODULES, [n.split("/services/gateway/")[1] for n in entered]
