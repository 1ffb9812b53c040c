"""A small Kaggle-API-compatible HTTP server for tests (stdlib only), whose "kernels" really run.

It speaks what the official `kaggle` package (2.x, through `kagglesdk`) sends for
`kernels push/status/output`: POSTs of camelCase JSON to ``/api/v1/<Service>/<Method>``
(``kernels.KernelsApiService/SaveKernel``, ``GetKernelSessionStatus``,
``ListKernelSessionOutput``; ``security.OAuthService/IntrospectToken`` for a `KAGGLE_API_TOKEN`),
Basic auth for a legacy kaggle.json key or a Bearer token, errors as ``{"code", "message"}``
with the HTTP status, enum values by name (``"RUNNING"``).

Pointing the client here: `KaggleApi` sends to https://api.kaggle.com unless
``KAGGLE_API_ENVIRONMENT=LOCALHOST`` (read when `kaggle` is imported), and then to
``http://localhost/api/v1/…`` — port 80, fixed. ``client_env()`` adds ``HTTP_PROXY`` pointing at
this server (requests honours it, and sends the full URL, which we parse), and
``NO_PROXY=127.0.0.1`` so the Hub test server stays direct. Nothing in kit knows about this.

A push saves a version and starts its "kernel": papermill runs the pushed notebook in a fresh
working folder (Kaggle's /kaggle/working) with ``kernel_env`` (the session's environment: a
Kaggle secret HF_TOKEN is an env var here), on the CPU. ``cut_after_s[n]`` kills version n's
whole process tree with SIGKILL that many seconds after its first checkpoint reached the store
(its log says ``store: step N published``): a session cut without warning, at a moment that
varies, but after it made progress — a cut during setup is the "no progress" case, tested on its
own. ``run_timeout_s`` is the session's hard time limit (Kaggle's 12 h). What
this does not emulate: the queue (a version runs at once), the log's JSON format (plain text
here), subfolders of the output (top-level files only), real accelerators.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

PUBLISHED = "published: "  # kit's log line when a checkpoint reached the store
QUOTA_MESSAGE = "You have used all of your weekly GPU quota. It resets on Saturday."


@dataclass
class Version:
    number: int
    work: Path
    state: str = "RUNNING"
    message: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    log: str = ""
    cut: bool = False


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:  # ended meanwhile
            continue
        ppid = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:")), 0)
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started, even in sessions of their own (torchrun's ranks)."""
    for p in [pid, *_descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class KaggleServer:
    def __init__(self, root: Path, *, users: dict[str, str] | None = None, tokens: dict[str, str] | None = None,
                 kernel_env: dict | None = None, cut_after_s: dict[int, float] | None = None,
                 quota_s: float | None = None, run_timeout_s: float = 900):
        self.root = Path(root)
        self.users = users or {}  # kaggle.json username → key
        self.tokens = tokens or {}  # access token → username
        self.kernel_env = kernel_env or dict(os.environ)
        self.cut_after_s = cut_after_s or {}
        self.quota_s, self.run_timeout_s = quota_s, run_timeout_s
        self.versions: list[Version] = []
        self.pushes: list[dict] = []  # every SaveKernel request body, as sent
        self.reject_next: tuple[int, str] | None = None
        self.lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def client_env(self) -> dict:
        return {"KAGGLE_API_ENVIRONMENT": "LOCALHOST", "HTTP_PROXY": self.url, "http_proxy": self.url,
                "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}

    def __enter__(self) -> "KaggleServer":
        threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True).start()  # fast shutdown()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        for t in self._threads:
            t.join(60)

    def used_s(self) -> float:
        return sum((v.ended or time.time()) - v.started for v in self.versions)

    # -- the "kernel" ---------------------------------------------------------------------
    def start(self, body: dict) -> Version:
        n = len(self.versions) + 1
        work = self.root / f"v{n}" / "working"
        work.mkdir(parents=True)
        source = self.root / f"v{n}" / "source.ipynb"
        source.write_text(body.get("text") or "")
        version = Version(n, work)
        self.versions.append(version)
        t = threading.Thread(target=self._run, args=(version, source), daemon=True)
        self._threads.append(t)
        t.start()
        return version

    def _run(self, version: Version, source: Path) -> None:
        out = source.with_name("executed.ipynb")
        cmd = [sys.executable, "-m", "papermill", str(source), str(out), "--cwd", str(version.work),
               "--kernel", "python3", "--log-output", "--no-progress-bar"]
        log_path = source.with_name("log.txt")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=self.kernel_env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            rc, anchor = None, None
            while (rc := proc.poll()) is None:
                now = time.time()
                if (anchor is None and version.number in self.cut_after_s
                        and PUBLISHED in log_path.read_text(errors="replace")):
                    anchor = now
                if now - version.started > self.run_timeout_s or (
                        anchor is not None and now - anchor > self.cut_after_s[version.number]):
                    kill_tree(proc.pid)
                    proc.wait()
                    rc, version.cut = None, True
                    break
                time.sleep(0.05)
        version.log = log_path.read_text(errors="replace")
        with self.lock:
            version.ended = time.time()
            if rc == 0:
                version.state = "COMPLETE"
            else:
                version.state = "ERROR"
                version.message = ("Your notebook was stopped because it exceeded the maximum run time"
                                   if version.cut else "Your notebook tried to run a cell that raised an error")


def _handler(server: KaggleServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as tests/hubserver.py: no ~40 ms delayed-ACK stall a request

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: dict | bytes, content_type="application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"code": status, "message": message})

        def _user(self) -> str | None:
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                user, _, key = base64.b64decode(auth[6:]).decode(errors="replace").partition(":")
                return user if server.users.get(user) == key else None
            if auth.startswith("Bearer "):
                return server.tokens.get(auth[7:])
            return None

        def do_GET(self) -> None:  # an output file's URL
            parts = unquote(urlsplit(self.path).path).strip("/").split("/")
            if len(parts) == 3 and parts[0] == "files" and parts[1].isdigit():
                n = int(parts[1])
                path = server.root / f"v{n}" / "working" / parts[2]
                if 1 <= n <= len(server.versions) and path.is_file():
                    return self._send(200, path.read_bytes(), "application/octet-stream")
            self._error(404, "Not found")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            path = urlsplit(self.path).path
            if path == "/api/v1/security.OAuthService/IntrospectToken":
                user = server.tokens.get(body.get("token", ""))
                return self._send(200, {"active": bool(user), "username": user or ""})
            user = self._user()
            if user is None:
                return self._error(401, "Unauthenticated")
            method = path.rsplit("/", 1)[-1]
            if method == "SaveKernel":
                return self._save(user, body)
            if method in ("GetKernelSessionStatus", "ListKernelSessionOutput"):
                if body.get("userName") != user or not server.versions:
                    return self._error(404, f"Kernel {body.get('userName')}/{body.get('kernelSlug')} not found")
                latest = server.versions[-1]
                if method == "GetKernelSessionStatus":
                    return self._send(200, {"status": latest.state, "failureMessage": latest.message})
                if latest.ended is None:
                    return self._send(200, {"files": [], "log": ""})
                files = [{"fileName": p.name, "url": f"http://localhost/files/{latest.number}/{quote(p.name)}"}
                         for p in sorted(latest.work.iterdir()) if p.is_file()]
                return self._send(200, {"files": files, "log": latest.log})
            self._error(404, f"no such method {method}")

        def _save(self, user: str, body: dict) -> None:
            server.pushes.append(body)
            if server.reject_next is not None:
                status, message = server.reject_next
                server.reject_next = None
                return self._error(status, message)
            slug = body.get("slug") or ""
            if slug.split("/")[0] != user:
                return self._error(403, f"Permission 'kernels.create' was denied for {slug}")
            if server.versions and server.versions[-1].ended is None:
                return self._error(409, "The notebook is already running; wait for it or cancel it")
            if server.quota_s is not None and body.get("enableGpu") and server.used_s() >= server.quota_s:
                return self._send(200, {"ref": f"/code/{slug}", "url": "", "error": QUOTA_MESSAGE})
            version = server.start(body)
            return self._send(200, {"ref": f"/code/{slug}", "url": f"http://localhost/code/{slug}",
                                    "versionNumber": version.number, "kernelId": 1})

    return Handler
