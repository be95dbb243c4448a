"""A small Hugging Face hub for the tests: the routes a hub client uses, over the project's own
files, counting what it is asked.

- `GET /api/models/ORG/NAME[/revision/REV]`: the model info with `siblings` (name, size, and
  for LFS files `lfs.sha256`), as the hub's model API answers with `?blobs=true`.
- `GET|HEAD /ORG/NAME/resolve/REV/FILE`: a file kept in git is answered here (ETag = its git
  blob id); an LFS file (*.gguf, *.safetensors) is redirected to `/lfs/...` (relative) or to a
  second server standing for the CDN, with `X-Linked-Etag` (its sha256), `X-Linked-Size` and
  `X-Repo-Commit`, as the hub does.
- Range requests (`bytes=A-`, `bytes=A-B`), answered 206 with `Content-Range`.

What a test can make go wrong: a private repository (401 without the token, 403 with another),
a connection dropped after N bytes of a file (once), a listing whose sha256 is not the bytes'
(`wrong_sha256`), a listing naming `../` files.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin")


@dataclass
class HubFile:
    name: str
    path: Path | None = None
    data: bytes | None = None

    def size(self) -> int:
        return len(self.data) if self.data is not None else self.path.stat().st_size

    def is_lfs(self) -> bool:
        return self.name.endswith(LFS_SUFFIXES)

    def read(self, start: int, end: int) -> bytes:
        if self.data is not None:
            return self.data[start:end]
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


@dataclass
class HubRepo:
    repo_id: str
    files: list[HubFile]
    commit: str = ""
    private: bool = False
    # The listing's sha256 of these files is wrong (the bytes served are the real ones).
    wrong_sha256: set[str] = field(default_factory=set)
    # Names listed beside the real files (path-safety tests); never served.
    extra_names: list[str] = field(default_factory=list)
    _sha: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if not self.commit:
            self.commit = hashlib.sha1(self.repo_id.encode()).hexdigest()

    def file(self, name: str) -> HubFile | None:
        return next((f for f in self.files if f.name == name), None)

    def sha256(self, f: HubFile) -> str:
        if f.name not in self._sha:
            h = hashlib.sha256()
            if f.data is not None:
                h.update(f.data)
            else:
                with open(f.path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
            self._sha[f.name] = h.hexdigest()
        if f.name in self.wrong_sha256:
            return hashlib.sha256(b"not these bytes").hexdigest()
        return self._sha[f.name]

    def git_blob_id(self, f: HubFile) -> str:
        data = f.read(0, f.size())
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def info(self) -> dict:
        siblings = []
        for f in self.files:
            s = {"rfilename": f.name, "size": f.size()}
            if f.is_lfs():
                s["lfs"] = {"sha256": self.sha256(f), "size": f.size(), "pointerSize": 134}
            else:
                s["blobId"] = self.git_blob_id(f)
            siblings.append(s)
        for name in self.extra_names:
            siblings.append({"rfilename": name, "size": 1})
        return {
            "_id": self.repo_id,
            "id": self.repo_id,
            "modelId": self.repo_id,
            "sha": self.commit,
            "private": self.private,
            "gated": False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }


class FakeHub:
    """`with FakeHub() as hub:` serves on 127.0.0.1; `hub.url` is its HF_ENDPOINT."""

    def __init__(self, token: str = "hf_fake_token", cdn: bool = False):
        self.repos: dict[str, HubRepo] = {}
        self.token = token
        self.lock = threading.Lock()
        # (method, path, range header, whether an Authorization header came) of every request.
        self.requests: list[tuple[str, str, str | None, bool]] = []
        # File name -> bytes after which its next download's connection is dropped (once).
        self.drop_after: dict[str, int] = {}
        # Bytes of file bodies sent, by file name.
        self.bytes_sent: dict[str, int] = {}
        # Bytes a second file bodies are sent at (None: as fast as the socket takes them).
        self.rate: int | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(is_cdn=False))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A second address for LFS bytes, as the hub's CDN: the token must never reach it.
        self._cdn = None
        self.cdn_url = None
        if cdn:
            self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), self._handler(is_cdn=True))
            self._cdn.daemon_threads = True
            self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def __enter__(self) -> "FakeHub":
        for srv in (self._server, self._cdn):
            if srv is not None:
                threading.Thread(target=srv.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        for srv in (self._server, self._cdn):
            if srv is not None:
                srv.shutdown()
                srv.server_close()

    def count(self, predicate) -> int:
        with self.lock:
            return sum(1 for r in self.requests if predicate(r))

    def file_requests(self, name: str) -> list[tuple[str, str, str | None, bool]]:
        """The GETs of a file's bytes (its resolve and its LFS address)."""
        with self.lock:
            return [r for r in self.requests if r[0] == "GET" and r[1].endswith("/" + name)]

    def _handler(self, is_cdn: bool):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._route(head=True)

            def do_GET(self):
                self._route(head=False)

            def _route(self, head: bool):
                path = unquote(urlsplit(self.path).path)
                with hub.lock:
                    hub.requests.append(
                        (
                            "HEAD" if head else "GET",
                            ("cdn:" if is_cdn else "") + path,
                            self.headers.get("Range"),
                            self.headers.get("Authorization") is not None,
                        )
                    )
                parts = path.strip("/").split("/")
                if is_cdn or parts[0] == "lfs":
                    # /lfs/ORG/NAME/FILE...
                    if is_cdn and self.headers.get("Authorization"):
                        return self._json(400, {"error": "the CDN was sent the hub token"})
                    repo = hub.repos.get("/".join(parts[1:3]))
                    f = repo.file("/".join(parts[3:])) if repo else None
                    if f is None:
                        return self._json(404, {"error": "no such LFS object"})
                    return self._body(f, head, {})
                if parts[0] == "api" and len(parts) >= 4 and parts[1] == "models":
                    repo = hub.repos.get("/".join(parts[2:4]))
                    revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
                    if repo is None:
                        return self._json(401 if not self._token_ok() else 404, {
                            "error": "Repository Not Found"})
                    if not self._authorized(repo):
                        return
                    if revision not in ("main", repo.commit):
                        return self._json(404, {"error": f"Invalid rev id: {revision}"})
                    return self._json(200, repo.info())
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo = hub.repos.get("/".join(parts[:2]))
                    if repo is None:
                        return self._json(404, {"error": "Repository Not Found"})
                    if not self._authorized(repo):
                        return
                    revision, name = parts[3], "/".join(parts[4:])
                    if revision not in ("main", repo.commit):
                        return self._json(404, {"error": "Revision Not Found"})
                    f = repo.file(name)
                    if f is None:
                        return self._json(404, {"error": "Entry Not Found"})
                    headers = {"X-Repo-Commit": repo.commit}
                    if f.is_lfs():
                        sha = repo.sha256(f)
                        base = hub.cdn_url or ""
                        self.send_response(302)
                        self.send_header("Location", f"{base}/lfs/{repo.repo_id}/{f.name}")
                        self.send_header("X-Repo-Commit", repo.commit)
                        self.send_header("X-Linked-Etag", f'"{sha}"')
                        self.send_header("X-Linked-Size", str(f.size()))
                        self.send_header("ETag", f'"{sha}"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    headers["ETag"] = f'"{repo.git_blob_id(f)}"'
                    return self._body(f, head, headers)
                return self._json(404, {"error": "no such route"})

            def _token_ok(self) -> bool:
                return self.headers.get("Authorization") == f"Bearer {hub.token}"

            def _authorized(self, repo: HubRepo) -> bool:
                if not repo.private:
                    return True
                auth = self.headers.get("Authorization")
                if auth is None:
                    self._json(401, {"error": "Invalid credentials in Authorization header"})
                    return False
                if auth != f"Bearer {hub.token}":
                    self._json(403, {"error": "Access to this repository is restricted"})
                    return False
                return True

            def _json(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self, f: HubFile, head: bool, headers: dict):
                size = f.size()
                start, end, status = 0, size, 200
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    a, _, b = rng[len("bytes="):].partition("-")
                    start = int(a) if a else 0
                    end = min(int(b) + 1, size) if b else size
                    if start >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    status = 206
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
                self.end_headers()
                if head:
                    return
                with hub.lock:
                    drop = hub.drop_after.pop(f.name, None)
                stop = end if drop is None else min(end, start + drop)
                self._send(f, start, stop)
                if drop is not None and stop < end:
                    # The connection goes away halfway, as a flaky network's does.
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)

            def _send(self, f: HubFile, start: int, stop: int):
                self.wfile.flush()
                sent = 0
                if f.path is not None:
                    piece = 8 << 20 if hub.rate is None else max(hub.rate // 10, 1)
                    with open(f.path, "rb") as fh:
                        while start + sent < stop:
                            n = os.sendfile(
                                self.connection.fileno(), fh.fileno(), start + sent,
                                min(stop - start - sent, piece))
                            if n == 0:
                                break
                            sent += n
                            if hub.rate is not None:
                                time.sleep(0.1)
                else:
                    self.wfile.write(f.data[start:stop])
                    sent = stop - start
                with hub.lock:
                    hub.bytes_sent[f.name] = hub.bytes_sent.get(f.name, 0) + sent

        return Handler
