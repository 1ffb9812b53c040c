"""What every checkpoint store does, written once over a few backend primitives.

A store holds ``checkpoints/checkpoint-N/`` folders (HF Trainer's checkpoint plus
``kit_manifest.json``) and small job records under ``kit/``. A vanilla HF Trainer
``last-checkpoint/`` folder (``hub_strategy="checkpoint"``) is a candidate too. Backends supply a
snapshot of the file listing, byte reads and downloads; this class decides what is complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path

from kit.errors import StoreError
from kit.files import parse_json
from kit.retry import retry
from kit.checkpoints.leftovers import owned_name
from kit.checkpoints.manifest import MANIFEST_NAME, bad_entry, parse_manifest, read_manifest, verify_files
from kit.checkpoints.store.leasing import LEASE_NAME
from kit.checkpoints.store.pacing import NO_LIMIT, CommitPacer
# The store's vocabulary lives in layout.py; importing it here keeps `store.base.X` working.
from kit.checkpoints.store.layout import (  # noqa: F401
    CKPT_DIR, CKPT_RE, FINAL, RECORDS_DIR, VANILLA_DIR, Candidate, Snapshot, StaleHead, TransientStoreError, Verdict,
    check_vanilla, final_step_of, kept_final_name, local_files, record_path,
)

log = logging.getLogger("kit.checkpoints.store")

# A download that fails on a timeout, a dropped connection, 429 or 5xx is tried again after these
# pauses; then the next older verified checkpoint is tried (as for one that does not verify).
FETCH_BACKOFF_S = (1.0, 2.0, 4.0)


class Store(ABC):
    """A place that holds checkpoints. Use :func:`kit.checkpoints.store.open_store` to get one."""

    pacer: CommitPacer = NO_LIMIT  # its commit budget (store/pacing.py): the Hub's is ~128 an hour

    # ---- backend primitives -------------------------------------------------------------------
    @abstractmethod
    def _snapshot(self) -> Snapshot: ...

    @abstractmethod
    def _read_bytes(self, path: str, snap: Snapshot) -> bytes | None: ...

    @abstractmethod
    def _download(self, paths: list[str], snap: Snapshot, dest_root: Path) -> None:
        """Write each store ``path`` to ``dest_root / path``."""

    @contextmanager
    def _reusing_downloads(self):
        """Within it, a file downloaded at the same commit may be served again (kit.checkpoints.store.reuse).
        Here, nothing to keep: reads are local; the Hub store keeps its copies."""
        yield

    @abstractmethod
    def publish(self, local_ckpt_dir: Path, step: int, keep: int) -> None: ...

    def read_checkpoint_file(self, step: int, name: str) -> bytes | None:
        """One small file of kit checkpoint `step` (e.g. trainer_state.json), or None if absent."""
        return self._read_bytes(f"checkpoints/checkpoint-{step}/{name}", self._snapshot())

    @abstractmethod
    def read_text(self, name: str) -> str | None: ...

    @abstractmethod
    def write_text(self, name: str, text: str) -> None: ...

    @abstractmethod
    def describe(self) -> str: ...

    def publish_final(self, local_dir: Path) -> tuple[str, str | None]:
        """Put a finished job's ``final/`` folder into the store in one step; returns where it is, and
        the folder (``final-step-N``, `layout.kept_final_name`) that now holds the store's earlier
        final/ of another step (an earlier target), or None: a deliverable is never replaced by
        one of another step; one of the same step is."""
        raise StoreError(f"{self.describe()} cannot hold a final/ folder")

    def final_step(self, snap: Snapshot | None = None) -> int | None:
        """The step of the ``final/`` folder the store holds, or None when it holds none."""
        raw = self._read_bytes("final/eval_results.json", snap or self._snapshot())
        try:
            return int(parse_json(raw)["step"]) if raw else None
        except (ValueError, KeyError, TypeError):
            return None

    @abstractmethod
    def check_writable(self) -> None:
        """Raise StoreError when a training run could not publish here (checked before one starts)."""

    def _deep_check(self, cand: Candidate, manifest: dict, snap: Snapshot) -> tuple[bool, str]:
        """Backends check the bytes here where they can (a directory hashes, the Hub downloads small files)."""
        return True, ""

    def compact_history(self) -> bool:
        """Drop what the store keeps of removed checkpoints beyond its current files; True when it did.

        A directory keeps no history: nothing to do. Call it only from the one thread that
        publishes (BackgroundSync's worker), so it never runs during a publish.
        """
        return False

    def preflight(self) -> None:  # noqa: B027 - a hook: stores with nothing to check keep this
        """Raise StoreError (one line) when the store cannot even be read: the check every entry point shares."""

    # ---- concurrency: what the lease and the session records rest on (store/leasing.py) -------
    @abstractmethod
    def swap_lease(self, decide) -> None:
        """Compare-and-swap the lease record: ``decide(current text | None)`` -> record to write, or None."""

    def read_lease(self) -> tuple[str | None, bool]:
        """(the lease record's text or None, whether no record at all means the lease was released)."""
        return self.read_text(LEASE_NAME), False

    def append_text(self, name: str, text: str) -> None:
        """Append to a job record. The lease makes this session the store's only writer, so
        read-then-write (the Hub has no append) loses nothing."""
        self.write_text(name, (self.read_text(name) or "") + text)

    # ---- shared logic ---------------------------------------------------------------------------
    def candidates(self, snap: Snapshot | None = None) -> list[Candidate]:
        """Kit checkpoints and a vanilla ``last-checkpoint/``, newest first (kit wins a tie)."""
        snap = snap or self._snapshot()
        by_step: dict[int, dict[str, int]] = {}
        vanilla: dict[str, int] = {}
        for path, size in snap.files.items():
            m = CKPT_RE.match(path)
            if m:
                by_step.setdefault(int(m.group(1)), {})[m.group(2)] = size
            elif path.startswith(VANILLA_DIR + "/"):
                vanilla[path[len(VANILLA_DIR) + 1:]] = size
        out = [Candidate(s, f"{CKPT_DIR}/checkpoint-{s}", "kit", f) for s, f in by_step.items()]
        if vanilla:
            step = self._vanilla_step(vanilla, snap)
            if step is not None:
                out.append(Candidate(step, VANILLA_DIR, "vanilla", vanilla))
        return sorted(out, key=lambda c: (c.step, c.kind == "kit"), reverse=True)

    def _vanilla_step(self, files: dict[str, int], snap: Snapshot) -> int | None:
        if "trainer_state.json" not in files:
            log.warning("%s: %s/ has no trainer_state.json; ignoring it", self.describe(), VANILLA_DIR)
            return None
        raw = self._read_bytes(f"{VANILLA_DIR}/trainer_state.json", snap)
        try:
            return int(parse_json(raw or b"")["global_step"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s: %s/trainer_state.json has no readable global_step; ignoring it",
                        self.describe(), VANILLA_DIR)
            return None

    def list_steps(self) -> list[int]:
        """Steps of the kit checkpoints present (complete or not), ascending."""
        return sorted(c.step for c in self.candidates() if c.kind == "kit")

    def inspect(self, snap: Snapshot | None = None, kinds: tuple[str, ...] = ("kit", "vanilla")) -> list[Verdict]:
        """Every candidate, newest first, with whether it verifies and why not."""
        snap = snap or self._snapshot()
        return [Verdict(c, *self.check(c, snap)) for c in self.candidates(snap) if c.kind in kinds]

    def check(self, cand: Candidate, snap: Snapshot) -> tuple[bool, str]:
        """Is ``cand`` complete in the store? ``(ok, reason)``; a result is remembered while its files stay the same."""
        key = (cand.prefix, tuple(sorted((rel, size, snap.ids.get(f"{cand.prefix}/{rel}"))
                                         for rel, size in cand.files.items())))
        cache = self.__dict__.setdefault("_checked", {})
        if key not in cache or not all(k[2] for k in key[1]):  # remembered only where files have ids
            cache[key] = self._check(cand, snap)
        return cache[key]

    def _check(self, cand: Candidate, snap: Snapshot) -> tuple[bool, str]:
        if cand.kind == "vanilla":
            return check_vanilla(cand.files)
        raw = self._read_bytes(f"{cand.prefix}/{MANIFEST_NAME}", snap)
        if raw is None:
            return False, f"no {MANIFEST_NAME} (partial upload?)"
        manifest = parse_manifest(raw)
        if manifest is None:
            return False, f"{MANIFEST_NAME} is not a valid kit manifest"
        if bad := bad_entry(manifest):
            return False, bad
        if int(manifest["step"]) != cand.step:
            return False, f"manifest says step {manifest['step']}"
        for rel, want in sorted(manifest["files"].items()):
            if rel not in cand.files:
                return False, f"{rel} is missing"
            if cand.files[rel] != want["size"]:
                return False, f"{rel} has {cand.files[rel]} bytes, manifest says {want['size']}"
            known = snap.sha256.get(f"{cand.prefix}/{rel}")
            if known and known != want["sha256"]:
                return False, f"{rel} sha256 differs from the manifest"
        return self._deep_check(cand, manifest, snap)

    def latest_valid(self) -> int | None:
        """The newest step whose checkpoint is complete; incomplete ones are skipped with a warning."""
        cand = self._latest_candidate()
        return cand.step if cand else None

    def _latest_candidate(self, below: int | None = None) -> Candidate | None:
        snap = self._snapshot()
        for cand in self.candidates(snap):
            if below is not None and cand.step >= below:
                continue
            ok, reason = self.check(cand, snap)
            if ok:
                return cand
            log.warning("%s: skipping %s (step %d): %s", self.describe(), cand.prefix, cand.step, reason)
        return None

    def fetch(self, step: int, dest_dir: Path, snap: Snapshot | None = None) -> Path:
        """Download checkpoint ``step`` to ``dest_dir``, verified; on failure ``dest_dir`` is untouched.

        ``snap``: the listing to fetch at (one the caller just checked), instead of listing again.

        Raises:
            StoreError: the step is absent, the download failed, or the bytes do not match.
        """
        dest_dir = Path(dest_dir)
        snap = snap or self._snapshot()
        cand = next((c for c in self.candidates(snap) if c.step == step), None)
        if cand is None:
            raise StoreError(f"{self.describe()} has no checkpoint for step {step}")
        dest_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=owned_name(f".{dest_dir.name}.fetch") + "-", dir=dest_dir.parent))
        try:
            self._download([f"{cand.prefix}/{rel}" for rel in cand.files], snap, tmp)
            got = tmp / cand.prefix
            if cand.kind == "kit":
                manifest = read_manifest(got)
                ok, reason = (False, f"no valid {MANIFEST_NAME}") if manifest is None else verify_files(got, manifest)
            else:
                ok, reason = check_vanilla({p.relative_to(got).as_posix(): p.stat().st_size
                                             for p in got.rglob("*") if p.is_file()})
            if not ok:
                raise StoreError(f"{cand.prefix} from {self.describe()} is corrupt: {reason}; "
                                 f"{dest_dir} was left as it was")
            _swap_into(got, dest_dir)
            return dest_dir
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def fetch_latest(self, dest_dir: Path, newer_than: int | None = None,
                     skipped: list[str] | None = None) -> int | None:
        """Fetch the newest complete checkpoint (newer than ``newer_than``), falling back to older ones.

        A checkpoint that does not verify is skipped for the next older one. A read or download
        that fails transiently (timeout, dropped connection, 429, 5xx) is retried after each pause
        of ``FETCH_BACKOFF_S``; when it keeps failing, the next older checkpoint is tried too.
        Why each one was passed over goes into ``skipped``. Returns the step fetched, or None
        when the store holds no usable checkpoint.

        Raises:
            TransientStoreError: nothing could be fetched and something failed only transiently,
                so the store may still hold a good checkpoint: starting fresh would train over it.
        """
        skipped = [] if skipped is None else skipped
        transient = None
        snap = _retrying(self._snapshot, f"listing {self.describe()}")
        for cand in self.candidates(snap):
            if newer_than is not None and cand.step <= newer_than:
                break
            try:
                # The check downloads the manifest and hashes the small files; the fetch, at the same
                # commit, reuses those copies and verifies every file against the manifest again.
                with self._reusing_downloads():
                    ok, reason = _retrying(lambda cand=cand: self.check(cand, snap), f"checking step {cand.step}")
                    if ok:
                        _retrying(lambda cand=cand: self.fetch(cand.step, dest_dir, snap), f"downloading step {cand.step}")
                        return cand.step
            except TransientStoreError as err:
                transient, reason = err, f"kept failing: {err}"
            except StoreError as err:
                reason = str(err)
            log.warning("%s: skipping %s (step %d): %s", self.describe(), cand.prefix, cand.step, reason)
            skipped.append(f"{cand.prefix} ({reason})")
        if transient is not None:
            raise TransientStoreError(f"no checkpoint could be fetched from {self.describe()}, and the last "
                                      f"failure was transient ({transient}): run again when it answers")
        return None


def _retrying(call, what: str):
    """``call()``, again after each pause of ``FETCH_BACKOFF_S`` while it fails transiently."""
    return retry(call, pauses=FETCH_BACKOFF_S, transient=(TransientStoreError,), what=what, log=log)


def _swap_into(src: Path, dest: Path) -> None:
    """Rename ``src`` to ``dest``; an existing ``dest`` is moved aside first and removed after."""
    old = None
    if dest.exists():
        old = dest.with_name(owned_name(f".{dest.name}.old"))
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dest, old)
    os.rename(src, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
