"""A small Hugging Face Hub-compatible HTTP server for tests (stdlib only).

It speaks the subset of the Hub protocol that the real ``huggingface_hub`` client (2.x) uses for
kit's checkpoint store: create_repo, repo_info/model_info, list_repo_tree (recursive),
list_repo_commits, preupload (``uploadMode: "regular"``, so the client never tries Xet; or, with
``lfs_threshold`` set, "lfs" for big files plus the LFS batch API and a PUT upload URL — the client
must then run with ``HF_HUB_DISABLE_XET=1``, as Xet cannot be served here), create_commit (ndjson, with ``parentCommit`` → 412 when stale: the compare-and-swap that
kit's lease relies on), and hf_hub_download (HEAD/GET on ``/{repo}/resolve/{rev}/{path}`` with the
40-hex ``X-Repo-Commit``, an ETag from the content, ``Content-Length`` and optional Range).

State lives in memory. Each commit is applied atomically under one lock and gets a new 40-hex
sha; every commit's tree is kept, so downloads pinned to an old sha keep working.

Failure injection (see ``HubServer.inject``): the next N matching requests answer a status code
(500/503/429/...), hang for some seconds, drop the connection halfway through the request body
(an upload cut off) or halfway through a download, or serve a download with one byte flipped.
``throttle_bps`` limits upload and download bandwidth. ``corrupt_stored`` damages a stored file
in place (the storage itself going bad, without a commit).

Use the ``hub`` fixture in ``tests/test_hubserver.py``-style tests::

    from tests.hubserver import HubServer
    with HubServer(tokens={"hf_write": "write", "hf_read": "read"}) as server:
        api = HfApi(endpoint=server.url, token="hf_write")
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
ROUTES = [
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    # Model-card metadata check that HF Trainer's push runs before uploading; accept any YAML.
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("GET", re.compile(rf"^/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?$"), "repo_info"),
    ("GET", re.compile(rf"^/api/models/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$"), "tree"),
    ("GET", re.compile(rf"^/api/models/{REPO}/commits/(?P<rev>[^/]+)$"), "commits"),
    # What the client asks before a CommitOperationCopy: each path's blob id, and LFS info for LFS files.
    ("POST", re.compile(rf"^/api/models/{REPO}/paths-info/(?P<rev>[^/]+)$"), "paths_info"),
    ("POST", re.compile(rf"^/api/models/{REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/models/{REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
    ("POST", re.compile(rf"^/api/models/{REPO}/super-squash/(?P<rev>[^/]+)$"), "super_squash"),
    ("POST", re.compile(rf"^/{REPO}\.git/info/lfs/objects/batch$"), "lfs_batch"),
    ("PUT", re.compile(r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$"), "lfs_put"),
    ("GET", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("HEAD", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
]
WRITES = {"create_repo", "preupload", "commit", "lfs", "super_squash"}
LFS_PREFIX = "lfs:"  # blob keys of LFS objects are "lfs:<sha256>"; regular blobs are git sha1s


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Commit:
    sha: str
    parent: str | None
    title: str
    files: dict[str, str]  # path -> blob sha1
    date: str
    added: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)  # oldest first

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def commit_at(self, rev: str) -> Commit | None:
        if rev == "main":
            return self.head
        for c in self.commits:
            if c.sha == rev or (len(rev) >= 7 and c.sha.startswith(rev)):
                return c
        return None


@dataclass
class Fault:
    """One injected failure: ``kind`` in status|hang|drop_upload|drop_download|flip_download."""

    kind: str
    times: int
    method: str | None
    path: re.Pattern | None
    status: int = 503
    seconds: float = 0.0
    hits: int = 0
    retry_after: int | None = None  # a Retry-After header on a status answer (the client honours it)


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-answer (a killed run, a test's timeout) is not a server error: without
    this, socketserver prints its traceback to stderr from a thread, into whatever test runs next."""

    def handle_error(self, request, client_address) -> None:
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class HubServer:
    """The server, its state and its failure controls. Start with ``start()`` or ``with``."""

    def __init__(self, tokens: dict[str, str] | None = None, host: str = "127.0.0.1"):
        self.tokens = dict(tokens or {})  # token -> "write" | "read"
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.throttle_bps: float | None = None  # shared by all connections, per direction
        self._link_free: dict[str, float] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status) log
        # A threading.Barrier that commits wait at before they are applied: a race test sets it to
        # Barrier(2), so two writers that both read the head are sure to commit against it (one 412s).
        self.commit_gate: threading.Barrier | None = None
        # Files of at least this size are answered "lfs" at preupload (the client must then run with
        # HF_HUB_DISABLE_XET=1) and are PUT as raw bytes; None keeps everything "regular" (base64).
        self.lfs_threshold: int | None = None
        self._httpd = _QuietServer((host, 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubServer":
        # A short poll: shutdown() waits up to one poll interval, and the default 0.5 s was paid by
        # every test that starts a server.
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.01,), name="hubserver",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- failure injection ------------------------------------------------------------------
    def inject(self, kind: str, *, times: int = 1, method: str | None = None, path: str | None = None,
               status: int = 503, seconds: float = 0.0, retry_after: int | None = None) -> Fault:
        """Make the next ``times`` requests matching ``method`` and the regex ``path`` fail.

        kinds: ``status`` (answer ``status``), ``hang`` (sleep ``seconds`` then answer normally),
        ``drop_upload`` (read half the body, then close the socket), ``drop_download`` (send the
        headers and half the body, then close), ``flip_download`` (serve the body with one byte flipped).
        ``retry_after`` adds that header to a ``status`` answer: huggingface_hub then waits that + 1 s
        instead of its own backoff (1, 2, 4, 8, 8 s), so a test of "keeps failing" waits 5 s, not 23 s.
        """
        fault = Fault(kind, times, method, re.compile(path) if path else None, status, seconds,
                      retry_after=retry_after)
        with self.lock:
            self.faults.append(fault)
        return fault

    def pace(self, nbytes: int, direction: str) -> None:
        """Shared bandwidth limit per direction: parallel connections split ``throttle_bps``."""
        bps = self.throttle_bps
        if not bps:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self._link_free.get(direction, 0.0))
            end = self._link_free[direction] = start + nbytes / bps
        if end > now:
            time.sleep(end - now)

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()
        self.throttle_bps = None

    def _take_fault(self, method: str, path: str, kinds: tuple[str, ...]) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.times <= 0 or f.kind not in kinds:
                    continue
                if f.method and f.method != method:
                    continue
                if f.path and not f.path.search(path):
                    continue
                f.times -= 1
                f.hits += 1
                return f
        return None

    # ---- state helpers for tests ------------------------------------------------------------
    def create(self, repo_id: str, private: bool = True) -> Repo:
        with self.lock:
            if repo_id not in self.repos:
                repo = Repo(repo_id, private)
                repo.commits.append(Commit(_new_sha(), None, "initial commit", {}, _now()))
                self.repos[repo_id] = repo
            return self.repos[repo_id]

    def commit_log(self, repo_id: str) -> list[Commit]:
        with self.lock:
            return list(self.repos[repo_id].commits)

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        with self.lock:
            commit = self.repos[repo_id].commit_at(rev)
            return {p: self.blobs[s] for p, s in commit.files.items()}

    def put_files(self, repo_id: str, files: dict[str, bytes], title: str = "seed") -> str:
        """Commit ``files`` directly (as another client would), returning the new sha."""
        repo = self.create(repo_id)
        with self.lock:
            tree = dict(repo.head.files)
            for p, data in files.items():
                lfs = self.lfs_threshold is not None and len(data) >= self.lfs_threshold
                key = LFS_PREFIX + hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
                self.blobs[key] = data
                tree[p] = key
            c = Commit(_new_sha(), repo.head.sha, title, tree, _now(), added=sorted(files))
            repo.commits.append(c)
            return c.sha

    def stored_bytes(self) -> int:
        """Bytes of every blob some commit of some repo still holds: what the storage costs."""
        with self.lock:
            live = {b for r in self.repos.values() for c in r.commits for b in c.files.values()}
            return sum(len(self.blobs[b]) for b in live if b in self.blobs)

    def free_unreferenced(self) -> None:
        """Drop blobs no commit holds (call with the lock held), as the Hub's storage GC does."""
        live = {b for r in self.repos.values() for c in r.commits for b in c.files.values()}
        for key in [k for k in self.blobs if k not in live]:
            del self.blobs[key]

    def corrupt_stored(self, repo_id: str, path: str, mode: str = "flip") -> None:
        """Damage a stored file in every commit that has it: ``flip`` a byte or ``truncate`` it."""
        with self.lock:
            old = self.repos[repo_id].head.files[path]
            data = bytearray(self.blobs[old])
            if mode == "flip":
                data[len(data) // 2] ^= 0xFF
            else:
                data = data[: len(data) // 2]
            self.blobs[old] = bytes(data)  # keyed by the old sha on purpose: storage rot, not a commit

    # ---- request handling (called from handler threads) ------------------------------------
    def auth(self, header: str | None) -> str | None:
        """The access level of the request's token: None (anonymous), "read" or "write"."""
        if not header:
            return None
        token = header.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise HubError(401, "Invalid credentials in Authorization header")
        return self.tokens[token]

    def check(self, action: str, repo: Repo | None, level: str | None) -> None:
        if action in WRITES:
            if level is None:
                raise HubError(401, "You must be authenticated to write")
            if level != "write":
                raise HubError(403, "You don't have the rights to write to this repository")
        elif repo is not None and repo.private and level is None:
            raise HubError(401, "Repository not found", "RepoNotFound")

    def get_repo(self, repo_id: str) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def get_commit(self, repo: Repo, rev: str) -> Commit:
        commit = repo.commit_at(unquote(rev))
        if commit is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return commit

    def apply_commit(self, repo: Repo, lines: list[dict]) -> Commit:
        header = lines[0]["value"]
        if self.commit_gate is not None:
            try:
                self.commit_gate.wait(timeout=10)
            except threading.BrokenBarrierError:  # the other writer never came: apply this one anyway
                pass
        with self.lock:
            head = repo.head
            parent = header.get("parentCommit")
            if parent and not head.sha.startswith(parent):
                raise HubError(412, f"A commit has happened since. Head is {head.sha}, not {parent}")
            tree = dict(head.files)
            added, deleted, new_blobs = [], [], {}
            for item in lines[1:]:
                key, value = item["key"], item["value"]
                path = value["path"].strip("/")
                if key == "file":
                    data = base64.b64decode(value["content"])
                    sha1 = git_blob_sha1(data)
                    new_blobs[sha1] = data
                    tree[path] = sha1
                    added.append(path)
                elif key == "lfsFile":
                    blob = LFS_PREFIX + value["oid"]
                    if blob not in self.blobs:
                        raise HubError(400, f"LFS object {value['oid']} was never uploaded")
                    tree[path] = blob
                    added.append(path)
                elif key == "deletedFile":
                    if path not in tree:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                    del tree[path]
                    deleted.append(path)
                elif key == "deletedFolder":
                    gone = [p for p in tree if p.startswith(path + "/")]
                    if not gone:
                        raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                    for p in gone:
                        del tree[p]
                    deleted.append(path + "/")
                else:
                    raise HubError(400, f"unsupported operation {key} (this test server takes regular files)")
            self.blobs.update(new_blobs)
            commit = Commit(_new_sha(), head.sha, header.get("summary", ""), tree, _now(), added, deleted)
            repo.commits.append(commit)
            return commit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hubserver/1"
    # Headers and body go out as two writes; with Nagle's algorithm on, the second waits for the
    # client's delayed ACK (~40 ms a request on loopback). Real servers set TCP_NODELAY too.
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        status = 500
        try:
            fault = self.hub._take_fault(method, path, ("status", "hang", "drop_upload"))
            if fault and fault.kind == "hang":
                time.sleep(fault.seconds)
            if fault and fault.kind == "drop_upload":
                self._read_body(limit=max(int(self.headers.get("Content-Length") or 0) // 2, 1))
                self._drop()
                status = 0
                return
            body = self._read_body()
            if fault and fault.kind == "status":
                raise HubError(fault.status, f"injected failure {fault.status}", retry_after=fault.retry_after)
            for m, pattern, action in ROUTES:
                match = pattern.match(path)
                if m == method and match:
                    status = getattr(self, "_" + action)(method, match.groupdict(), query, body)
                    return
            raise HubError(404, f"no route for {method} {path}")
        except HubError as err:
            status = err.status
            self._send_json(err.status, {"error": err.message}, error=err)
        except (BrokenPipeError, ConnectionResetError):
            status = 0
        finally:
            self.hub.requests.append((method, path, status))

    # ---- plumbing --------------------------------------------------------------------------
    def _read_body(self, limit: int | None = None) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(limit)
        length = int(self.headers.get("Content-Length") or 0)
        if limit is not None:
            length = min(length, limit)
        chunks, left = [], length
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
            self._throttle(len(chunk))
        return b"".join(chunks)

    def _read_chunked(self, limit: int | None) -> bytes:
        chunks, total = [], 0
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return b"".join(chunks)
            chunk = self.rfile.read(size)
            self.rfile.readline()
            chunks.append(chunk)
            total += len(chunk)
            self._throttle(len(chunk))
            if limit is not None and total >= limit:
                return b"".join(chunks)

    def _throttle(self, nbytes: int, direction: str = "up") -> None:
        self.hub.pace(nbytes, direction)

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None,
              head_only: bool = False, content_length: int | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        if not head_only:
            self.wfile.write(body)

    def _send_json(self, status: int, obj, error: HubError | None = None) -> None:
        headers = {"Content-Type": "application/json"}
        if error is not None:
            headers["X-Error-Message"] = error.message
            if error.code:
                headers["X-Error-Code"] = error.code
            if error.retry_after is not None:
                headers["Retry-After"] = str(error.retry_after)
        # A HEAD answer carries no body: writing one corrupts the next response on a kept-alive
        # connection (seen with TRL's telemetry HEAD request).
        self._send(status, json.dumps(obj).encode(), headers, head_only=self.command == "HEAD")

    def _repo_for(self, action: str, repo_id: str) -> Repo:
        level = self.hub.auth(self.headers.get("Authorization"))
        repo = self.hub.repos.get(repo_id)
        self.hub.check(action, repo, level)
        return self.hub.get_repo(repo_id)

    # ---- endpoints -------------------------------------------------------------------------
    def _validate_yaml(self, method, groups, query, body) -> int:
        self._send_json(200, {"errors": [], "warnings": []})
        return 200

    def _create_repo(self, method, groups, query, body) -> int:
        payload = json.loads(body or b"{}")
        level = self.hub.auth(self.headers.get("Authorization"))
        self.hub.check("create_repo", None, level)
        # Without an organization the real Hub puts the repo under the token's user: here "user".
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        if repo_id in self.hub.repos:  # the real Hub's 409 body carries the url too; the client reads it
            err = HubError(409, "You already created this model repo")
            self._send_json(409, {"error": err.message, "url": f"{self.hub.url}/{repo_id}"}, error=err)
            return 409
        private = payload.get("visibility", "private" if payload.get("private") else "public") == "private"
        self.hub.create(repo_id, private=private)
        self._send_json(200, {"url": f"{self.hub.url}/{repo_id}", "name": repo_id, "id": repo_id})
        return 200

    def _repo_info(self, method, groups, query, body) -> int:
        repo = self._repo_for("read", groups["repo"])
        commit = self.hub.get_commit(repo, groups.get("rev") or "main")
        self._send_json(200, {
            "id": repo.repo_id, "modelId": repo.repo_id, "sha": commit.sha, "private": repo.private,
            "lastModified": commit.date, "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        })
        return 200

    def _tree(self, method, groups, query, body) -> int:
        repo = self._repo_for("read", groups["repo"])
        commit = self.hub.get_commit(repo, groups["rev"])
        base = unquote(groups.get("path") or "").strip("/")
        recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
        prefix = base + "/" if base else ""
        if base and base in commit.files:
            raise HubError(404, f"{base} is a file", "EntryNotFound")
        entries, folders = [], set()
        for p in sorted(commit.files):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                if recursive or depth == 1:
                    folders.add(prefix + "/".join(rest[:depth]))
            if recursive or len(rest) == 1:
                entries.append(self._file_entry(commit, p))
        if base and not entries and not folders:
            raise HubError(404, f"{base} does not exist", "EntryNotFound")
        dirs = [{"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()} for d in folders]
        self._send_json(200, sorted(dirs, key=lambda d: d["path"]) + entries)
        return 200

    def _file_entry(self, commit: Commit, p: str) -> dict:
        blob = commit.files[p]
        entry = {"type": "file", "path": p, "oid": blob, "size": len(self.hub.blobs[blob])}
        if blob.startswith(LFS_PREFIX):
            pointer = _lfs_pointer(blob.removeprefix(LFS_PREFIX), entry["size"])
            entry["oid"] = git_blob_sha1(pointer)
            entry["lfs"] = {"oid": blob.removeprefix(LFS_PREFIX), "size": entry["size"], "pointerSize": len(pointer)}
        return entry

    def _paths_info(self, method, groups, query, body) -> int:
        repo = self._repo_for("read", groups["repo"])
        commit = self.hub.get_commit(repo, unquote(groups["rev"]))
        form = parse_qs(body.decode("utf-8"))
        out = []
        for p in form.get("paths", []):
            p = p.strip("/")
            if p in commit.files:
                out.append(self._file_entry(commit, p))
            elif any(f.startswith(p + "/") for f in commit.files):
                out.append({"type": "directory", "path": p, "oid": hashlib.sha1(p.encode()).hexdigest()})
        self._send_json(200, out)
        return 200

    def _commits(self, method, groups, query, body) -> int:
        repo = self._repo_for("read", groups["repo"])
        commit = self.hub.get_commit(repo, groups["rev"])
        history = repo.commits[: repo.commits.index(commit) + 1]
        self._send_json(200, [{"id": c.sha, "title": c.title, "message": "", "date": c.date,
                               "authors": [{"user": "test"}]} for c in reversed(history)])
        return 200

    def _super_squash(self, method, groups, query, body) -> int:
        """The branch becomes one commit holding its current tree; blobs no commit holds are freed."""
        repo = self._repo_for("super_squash", groups["repo"])
        if groups["rev"] != "main":
            raise HubError(400, "this test server squashes main only")
        message = (json.loads(body or b"{}") or {}).get("message", "squash")
        with self.hub.lock:
            head = repo.head
            repo.commits[:] = [Commit(_new_sha(), None, message, dict(head.files), _now())]
            self.hub.free_unreferenced()
        self._send_json(200, {"commitId": repo.head.sha})
        return 200

    def _preupload(self, method, groups, query, body) -> int:
        repo = self._repo_for("preupload", groups["repo"])
        head = self.hub.get_commit(repo, groups["rev"])
        files = json.loads(body)["files"]
        lfs = self.hub.lfs_threshold

        def mode(f):
            return "lfs" if lfs is not None and f["size"] >= lfs and f["size"] > 0 else "regular"

        def oid(f):
            blob = head.files.get(f["path"])
            return blob.removeprefix(LFS_PREFIX) if blob else None

        self._send_json(200, {"files": [{"path": f["path"], "uploadMode": mode(f), "shouldIgnore": False,
                                         "oid": oid(f)} for f in files]})
        return 200

    def _commit(self, method, groups, query, body) -> int:
        repo = self._repo_for("commit", groups["repo"])
        if unquote(groups["rev"]) != "main":
            raise HubError(400, "this test server commits to main only")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        commit = self.hub.apply_commit(repo, lines)
        self._send_json(200, {"success": True, "commitOid": commit.sha, "commitMessage": commit.title,
                              "commitUrl": f"{self.hub.url}/{repo.repo_id}/commit/{commit.sha}"})
        return 200

    def _lfs_batch(self, method, groups, query, body) -> int:
        self._repo_for("lfs", groups["repo"])
        objects = []
        for obj in json.loads(body)["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if LFS_PREFIX + obj["oid"] not in self.hub.blobs:
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs-upload/{obj['oid']}"}}
            objects.append(entry)
        self._send_json(200, {"transfer": "basic", "objects": objects})
        return 200

    def _lfs_put(self, method, groups, query, body) -> int:
        # Like a presigned S3 URL: no token needed, but the bytes must match the announced sha256.
        if hashlib.sha256(body).hexdigest() != groups["oid"]:
            raise HubError(400, "uploaded bytes do not match the LFS oid")
        with self.hub.lock:
            self.hub.blobs[LFS_PREFIX + groups["oid"]] = body
        self._send(200, b"")
        return 200

    def _resolve(self, method, groups, query, body) -> int:
        repo = self._repo_for("read", groups["repo"])
        commit = self.hub.get_commit(repo, groups["rev"])
        path = unquote(groups["path"])
        if path not in commit.files:
            raise HubError(404, f"{path} not found", "EntryNotFound")
        sha1 = commit.files[path]
        data = self.hub.blobs[sha1]
        etag = sha1.removeprefix(LFS_PREFIX)  # LFS: sha256 of the content, as the Hub's X-Linked-Etag
        headers = {"X-Repo-Commit": commit.sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if method == "HEAD":
            self._send(200, b"", headers, head_only=True, content_length=len(data))
            return 200
        status, start = 200, 0
        m = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
        if m and int(m.group(1)) < len(data):
            status, start = 206, int(m.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body_out = data[start:]
        fault = self.hub._take_fault(method, self.path, ("drop_download", "flip_download"))
        if fault and fault.kind == "flip_download" and body_out:
            flipped = bytearray(body_out)
            flipped[len(flipped) // 2] ^= 0xFF
            body_out = bytes(flipped)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body_out)))
        self.end_headers()
        cut = len(body_out) // 2 if fault and fault.kind == "drop_download" else len(body_out)
        for i in range(0, cut, 1 << 16):
            chunk = body_out[i:min(i + (1 << 16), cut)]
            self.wfile.write(chunk)
            self._throttle(len(chunk), "down")
        if cut < len(body_out):
            self.wfile.flush()
            self._drop()
        return status


def _lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _new_sha() -> str:
    return os.urandom(20).hex()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---- pytest fixtures (import them into a test module: `from tests.hubserver import hub`) ---------
WRITE_TOKEN = "hf_" + "fakeWRITEtoken0123456789abcdef"  # built, so no token-like literal is committed
READ_TOKEN = "hf_fakeREADtoken0123456789abcdef"

try:
    import pytest
except ImportError:  # the benchmark imports HubServer without pytest
    pytest = None

if pytest is not None:

    @pytest.fixture
    def hub(monkeypatch):
        """A running HubServer with a write token and a read-only token; HF_ENDPOINT points at it
        and no real token leaks in from the environment."""
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        with HubServer(tokens={WRITE_TOKEN: "write", READ_TOKEN: "read"}) as server:
            monkeypatch.setenv("HF_ENDPOINT", server.url)
            yield server
