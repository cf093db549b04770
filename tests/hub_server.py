"""A local server speaking the part of the Hugging Face Hub's HTTP API that ``huggingface_hub``
downloads with (repo info, tree listing, and resolve with HEAD/GET), serving checkpoint
directories as model repositories. Point ``HF_ENDPOINT`` at it: the Hub code path runs for real,
with no internet."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass(frozen=True, slots=True)
class HubRepo:
    repo_id: str  # "org/name"
    directory: Path
    commit: str  # 40 hex digits
    branch: str = "main"

    def files(self) -> list[Path]:
        return sorted(p for p in self.directory.rglob("*") if p.is_file())


class HubServer:
    """``with HubServer(repos) as hub: hub.endpoint`` -> "http://127.0.0.1:PORT"."""

    def __init__(self, repos: list[HubRepo]) -> None:
        self.repos = {repo.repo_id: repo for repo in repos}
        self.requests: list[str] = []  # "METHOD path", for tests to read
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, *, body: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                for repo in hub.repos.values():
                    api = f"/api/models/{repo.repo_id}/"
                    if path.startswith(api + "revision/"):
                        return self._json(self._info(repo), body)
                    if path.startswith(api + "tree/"):
                        return self._json(self._tree(repo), body)
                    resolve = f"/{repo.repo_id}/resolve/"
                    if path.startswith(resolve):
                        revision, _, name = path[len(resolve) :].partition("/")
                        if revision not in (repo.commit, repo.branch):
                            return self._error(404, "RevisionNotFound")
                        return self._file(repo, name, body)
                self._error(404, "RepoNotFound")

            def _info(self, repo: HubRepo) -> dict:
                siblings = [{"rfilename": str(p.relative_to(repo.directory))} for p in repo.files()]
                return {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False, "siblings": siblings}

            def _tree(self, repo: HubRepo) -> list[dict]:
                return [
                    {"type": "file", "path": str(p.relative_to(repo.directory)), "size": p.stat().st_size, "oid": _oid(p)}
                    for p in repo.files()
                ]

            def _file(self, repo: HubRepo, name: str, body: bool) -> None:
                file = repo.directory / name
                if not file.is_file() or repo.directory not in file.resolve().parents:
                    return self._error(404, "EntryNotFound")
                data = file.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{_oid(file)}"')
                self.send_header("X-Repo-Commit", repo.commit)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _json(self, value, body: bool) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _error(self, status: int, code: str) -> None:
                data = json.dumps({"error": code}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _oid(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()
