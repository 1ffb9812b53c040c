"""A checkpoint store in a private Hugging Face Hub repo (``hf://owner/name``).

Each publish is ONE commit: it adds ``checkpoints/checkpoint-N/*`` (manifest included) and
deletes the checkpoints beyond the newest ``keep`` together, with ``parent_commit`` set to the
head we listed, so a concurrent writer makes it fail (412) instead of deleting the wrong thing.
Reads are pinned to one commit sha, so a listing and the downloads that follow always agree.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from huggingface_hub import CommitOperationAdd, CommitOperationCopy, CommitOperationDelete, HfApi, constants
from huggingface_hub.errors import HfHubHTTPError

from kit.auth import find_token
from kit.errors import StoreError
from kit.checkpoints.store.pacing import CommitPacer
from kit.checkpoints.store.reuse import DownloadReuse
from kit.checkpoints.manifest import sha256_file
from kit.checkpoints.store.base import (
    CKPT_DIR,
    FINAL,
    Snapshot,
    StaleHead,
    Store,
    TransientStoreError,
    final_step_of,
    kept_final_name,
    local_files,
    record_path,
)
from kit.checkpoints.store import hub_errors, leasing
from kit.checkpoints.store.hub_errors import NO_TOKEN, OFFLINE
from kit.checkpoints.store.hub_http import first_line, hub_offline, network_timeout_s, use_timeouts
from kit.checkpoints.store.retention import prune, steps_to_delete
from kit.planning.names import parse_repo_id

log = logging.getLogger("kit.checkpoints.store")

_CAS_ATTEMPTS = 4
DEEP_CHECK_MAX_BYTES = 10 * 2**20  # the Hub stores larger files through LFS/Xet, with a sha256 in the listing


class HubStore(Store):
    """Checkpoints in a private Hub repo. The token is used, never shown."""

    def __init__(self, repo_id: str, *, token: str | None = None, endpoint: str | None = None,
                 timeout_s: float | None = None):
        self.repo_id = parse_repo_id(repo_id)
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self._token = token if token is not None else find_token()
        self.api = HfApi(endpoint=self.endpoint, token=self._token or False)
        self._repo_ready = False
        self.pacer = CommitPacer()  # the Hub's ~128 commits/h per repo
        self._reuse = DownloadReuse(DEEP_CHECK_MAX_BYTES)  # a resume's check and fetch download once
        self.timeout_s = network_timeout_s() if timeout_s is None else timeout_s
        use_timeouts(self.timeout_s)

    def __repr__(self) -> str:
        return f"HubStore({self.describe()!r})"

    def describe(self) -> str:
        return f"hf://{self.repo_id}"

    def _errors(self, action: str):
        return hub_errors.mapped(self, action)  # every Hub failure as a one-line StoreError

    def preflight(self) -> None:
        """One request, before anything else: offline mode and a silent endpoint fail here, in one line.

        A timeout here is final (exit 4), not retried: callers that retry (the lease) would
        otherwise wait several timeouts on a server that never answers.
        """
        if hub_offline():
            raise StoreError(OFFLINE.format(store=self.describe()))
        try:
            self.head()
        except TransientStoreError as err:
            raise StoreError(f"{err}: check HF_ENDPOINT and the network") from None

    def check_writable(self) -> None:
        self._need_token()  # whether the token may write shows at the first commit (403, one line)

    def _need_token(self) -> None:
        if not self._token:
            raise StoreError(NO_TOKEN)

    def ensure_repo(self) -> None:
        """Create the private repo when it does not exist yet (no-op when it does)."""
        if self._repo_ready:
            return
        self._need_token()
        # Look before creating: on a 403 for an existing repo, huggingface_hub 2.4's create_repo
        # builds a RepoUrl without our endpoint and fails on any non-huggingface.co host.
        if self.head() is None:
            with self._errors("creating the repo"):
                self.api.create_repo(self.repo_id, private=True, exist_ok=True)
        self._repo_ready = True

    # ---- reading ------------------------------------------------------------------------------
    def head(self) -> str | None:
        """The sha of ``main``, or None when the repo does not exist."""
        try:
            with self._errors("reading the repo"):
                return self.api.repo_info(self.repo_id, revision="main").sha
        except StoreError as err:
            if getattr(err, "status", None) == 404:
                return None
            raise

    def _snapshot(self) -> Snapshot:
        sha = self.head()
        if sha is None:
            return Snapshot(None, {})
        files, sha256, ids = {}, {}, {}
        with self._errors("listing the repo"):
            for entry in self.api.list_repo_tree(self.repo_id, recursive=True, revision=sha):
                if hasattr(entry, "size"):
                    files[entry.path] = entry.size
                    ids[entry.path] = getattr(entry, "blob_id", None) or ""
                    if getattr(entry, "lfs", None) is not None:
                        sha256[entry.path] = entry.lfs.sha256
        return Snapshot(sha, files, sha256, ids)

    def _deep_check(self, cand, manifest: dict, snap: Snapshot) -> tuple[bool, str]:
        """Hash what the listing gives no sha256 for (regular, non-LFS files: small by the Hub's rules).

        Without this a same-size corrupt file passes until the resume download; with it, status
        and pruning see it. Larger files without a sha256 stay checked by size only.
        """
        todo = [rel for rel in sorted(manifest["files"]) if f"{cand.prefix}/{rel}" not in snap.sha256
                and manifest["files"][rel]["size"] <= DEEP_CHECK_MAX_BYTES]
        if not todo:
            return True, ""
        with tempfile.TemporaryDirectory(prefix="kit-hub-check-") as tmp:
            self._download([f"{cand.prefix}/{rel}" for rel in todo], snap, Path(tmp))
            for rel in todo:
                if sha256_file(Path(tmp) / cand.prefix / rel) != manifest["files"][rel]["sha256"]:
                    return False, f"{rel} sha256 differs from the manifest"
        return True, ""

    def _read_bytes(self, path: str, snap: Snapshot) -> bytes | None:
        if snap.version is None or path not in snap.files:
            return None
        with tempfile.TemporaryDirectory(prefix="kit-hub-read-") as tmp:
            self._download([path], snap, Path(tmp))
            return (Path(tmp) / path).read_bytes()

    def _reusing_downloads(self):
        return self._reuse.active()

    def _download(self, paths: list[str], snap: Snapshot, dest_root: Path) -> None:
        for path in paths:
            target = Path(dest_root) / path
            kept = self._reuse.get(snap.version, path)
            if kept is not None:  # the same bytes, already downloaded at this commit
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(kept, target)
                continue
            self._download_one(path, snap, dest_root)
            self._reuse.keep(snap.version, path, target)

    def _download_one(self, path: str, snap: Snapshot, dest_root: Path) -> None:
        with self._errors(f"downloading {path}"):
            try:
                self.api.hf_hub_download(self.repo_id, path, revision=snap.version, local_dir=dest_root)
            except HfHubHTTPError:  # some of these are OSErrors too: map them by status first
                raise
            except OSError as err:  # the client's size consistency check, a full disk
                raise StoreError(f"downloading {path} from {self.describe()} failed: "
                                 f"{first_line(err)}") from None

    def read_text(self, name: str) -> str | None:
        raw = self._read_bytes(record_path(name), self._snapshot())
        return None if raw is None else raw.decode()

    def read_text_at_head(self, name: str) -> tuple[str | None, str | None]:
        """``(text or None, head sha)`` from one snapshot: the read half of a compare-and-swap."""
        snap = self._snapshot()
        raw = self._read_bytes(record_path(name), snap)
        return (None if raw is None else raw.decode()), snap.version

    # ---- writing ------------------------------------------------------------------------------
    def write_text(self, name: str, text: str, *, parent: str | None = None) -> str:
        """Commit one small record; with ``parent`` the commit fails with :class:`StaleHead` if main moved."""
        self.ensure_repo()
        path = record_path(name)
        with self._errors(f"writing {path}"):
            info = self.api.create_commit(self.repo_id, [CommitOperationAdd(path, text.encode())],
                                          commit_message=f"kit: update {path}", parent_commit=parent)
        self.pacer.note()
        return info.oid

    def swap_lease(self, decide) -> None:  # compare-and-swap on parent_commit (store/leasing.py)
        leasing.hub_swap(self, decide)

    def publish(self, local_ckpt_dir: Path, step: int, keep: int) -> None:
        """Upload ``local_ckpt_dir`` as ``checkpoints/checkpoint-{step}`` and prune, in ONE commit."""
        manifest, names = local_files(local_ckpt_dir, step)
        self._need_token()
        steps_to_delete([], step, keep)  # validates keep before any network traffic
        self.ensure_repo()
        for attempt in range(_CAS_ATTEMPTS):
            snap = self._snapshot()
            doomed = prune(self.inspect(snap, kinds=("kit",)), step, keep)
            ops = self._additions(Path(local_ckpt_dir), step, manifest, names)
            ops += [CommitOperationDelete(f"{CKPT_DIR}/checkpoint-{s}/", is_folder=True) for s in doomed]
            message = f"kit: checkpoint {step}" + (f", drop {', '.join(map(str, doomed))}" if doomed else "")
            try:
                with self._errors(f"publishing step {step}"):
                    self.api.create_commit(self.repo_id, ops, commit_message=message, parent_commit=snap.version)
                self.pacer.note()
                return
            except StaleHead:
                log.info("%s moved while publishing step %d; re-reading (attempt %d)",
                         self.describe(), step, attempt + 1)
        raise TransientStoreError(f"{self.describe()} kept changing under us; step {step} not published yet")

    def publish_final(self, local_dir: Path) -> tuple[str, str | None]:
        """Upload ``local_dir`` as ``final/`` plus its README.md (the model card) at the root, in ONE commit.

        The same commit removes what an earlier final/ held that this one does not, and copies an
        earlier final/ of another step to ``final-step-N/`` first (Store.publish_final): the Hub copies
        LFS files by reference; small regular ones are fetched and uploaded again by the client.
        """
        self._need_token()
        self.ensure_repo()
        snap = self._snapshot()
        earlier = [p for p in snap.files if p.startswith(f"{FINAL}/")]
        ops, kept = [], None
        if earlier and self.final_step(snap) != final_step_of(local_dir):
            kept = kept_final_name(self.final_step(snap), {p.split("/", 1)[0] for p in snap.files})
            ops += [CommitOperationCopy(p, f"{kept}/{p[len(FINAL) + 1:]}", src_revision=snap.version)
                    for p in sorted(earlier)]
        where = self.publish_folder(local_dir, f"{FINAL}/", "kit: final (adapter, eval results, model card)",
                                    card_at_root=True, also=ops, replacing=earlier)
        return where, kept

    def publish_folder(self, local_dir: Path, prefix: str, message: str, card_at_root: bool = False,
                       also: list | None = None, replacing: list[str] | None = None) -> str:
        """Upload every file of ``local_dir`` under ``prefix`` in one commit; returns the folder's URL.

        `also`: more operations for the same commit (done first); `replacing`: the paths under `prefix`
        now, of which those `local_dir` lacks are deleted in it.
        """
        self._need_token()
        self.ensure_repo()
        local_dir = Path(local_dir)
        adds = [CommitOperationAdd(f"{prefix}{p.relative_to(local_dir).as_posix()}", str(p))
                for p in sorted(local_dir.rglob("*")) if p.is_file()]
        new = {op.path_in_repo for op in adds}
        ops = [*(also or []), *adds, *(CommitOperationDelete(p) for p in sorted(replacing or ()) if p not in new)]
        if card_at_root and (local_dir / "README.md").is_file():
            ops.append(CommitOperationAdd("README.md", str(local_dir / "README.md")))
        with self._errors(f"publishing {prefix or 'the folder'}"):
            self.api.create_commit(self.repo_id, ops, commit_message=message)
        return f"{self.endpoint}/{self.repo_id}" + (f"/tree/main/{prefix.rstrip('/')}" if prefix else "")

    def compact_history(self) -> bool:
        """Squash ``main`` into one commit (huggingface_hub's ``super_squash_history``).

        Pruning deletes old checkpoints from the repo's current files only; every commit still
        holds its files, so each checkpoint ever pushed keeps using storage until the history goes.
        Commits and pinned shas from before the squash are gone afterwards: a reader pinned to one
        (another machine's `kit status` mid-listing) gets a 404 and reads again.
        """
        self._need_token()
        with self._errors("squashing the history"):
            self.api.super_squash_history(self.repo_id, branch="main",
                                          commit_message="kit: squash history (checkpoints removed earlier free their storage)")
        return True

    def _additions(self, local: Path, step: int, manifest: dict, names: list[str]) -> list:
        ops = []
        for rel in names:
            try:
                op = CommitOperationAdd(f"{CKPT_DIR}/checkpoint-{step}/{rel}", str(local / rel))
            except (OSError, ValueError) as err:
                raise StoreError(f"cannot read {local / rel}: {err}") from None
            want = manifest["files"].get(rel)
            if want is not None and op.upload_info.sha256.hex() != want["sha256"]:
                raise StoreError(f"{local}/{rel} changed since its manifest was written; not publishing "
                                 "a checkpoint that would not verify")
            ops.append(op)
        return ops
