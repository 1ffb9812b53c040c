"""What verification-based pruning costs a publish, and how fast a silent Hub endpoint is given up on.

    python bench/store_checks.py                 # writes bench/results/store_checks_cpu.json
    python bench/store_checks.py --mb 64 --keep 3 --silent-timeout 60

1. Publishing: ``--keep`` + 1 checkpoints of ``--mb`` MiB each (random bytes, HF Trainer layout)
   are published one after another to a directory store and to a Hub store (the real
   huggingface_hub client against tests/hubserver.py, LFS uploads). Each publish now judges the
   existing checkpoints (pruning counts only verified ones): the first judgement hashes them (a
   directory) or downloads their small files (the Hub), later ones reuse it while the files are
   unchanged. Reported: every publish's seconds, and a cold vs warm ``inspect()``.
2. A silent endpoint: ``kit status store=hf://me/x`` against a TCP server that accepts and never
   answers, with ``KIT_NETWORK_TIMEOUT_S`` = ``--silent-timeout``: seconds until exit 4.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"  # LFS instead of Xet, which cannot be served here
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kit.checkpoints.manifest import write_manifest  # noqa: E402
from kit.checkpoints.store import DirStore  # noqa: E402
from kit.checkpoints.store.hub import HubStore  # noqa: E402
from tests.hubserver import WRITE_TOKEN, HubServer  # noqa: E402


def make_ckpt(root: Path, step: int, mb: int) -> Path:
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "adapter_model.safetensors").write_bytes(os.urandom(mb * 2**20 // 3))
    (d / "optimizer.pt").write_bytes(os.urandom(mb * 2**20 * 2 // 3))
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (d / "adapter_config.json").write_text("{}")
    write_manifest(d, step, 1, {"model": "bench"})
    return d


def publishes(store, ckpts: list[Path], keep: int) -> dict:
    times = []
    for i, d in enumerate(ckpts, 1):
        t0 = time.perf_counter()
        store.publish(d, i, keep=keep)
        times.append(round(time.perf_counter() - t0, 3))
    # A fresh instance has judged nothing yet: its first inspect() is what a new session pays.
    fresh = type(store)(store.root) if isinstance(store, DirStore) else HubStore(
        store.repo_id, token=WRITE_TOKEN, endpoint=store.endpoint)
    t0 = time.perf_counter()
    fresh.inspect()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh.inspect()
    warm = time.perf_counter() - t0
    return {"publish_s": times, "inspect_cold_s": round(cold, 3), "inspect_warm_s": round(warm, 3)}


def silent_status(timeout_s: float) -> dict:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(srv.accept()[0]) for _ in range(8)], daemon=True).start()
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{srv.getsockname()[1]}", HF_TOKEN=WRITE_TOKEN,
               HF_HUB_OFFLINE="0", KIT_NETWORK_TIMEOUT_S=str(timeout_s), PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "kit", "status", "store=hf://me/x"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout_s * 5 + 60)
    took = time.perf_counter() - t0
    srv.close()
    return {"timeout_s": timeout_s, "exit_code": r.returncode, "seconds_to_exit": round(took, 1),
            "error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--silent-timeout", type=float, default=60.0)
    ap.add_argument("-o", default=str(ROOT / "bench/results/store_checks_cpu.json"))
    args = ap.parse_args()
    out: dict = {"machine": platform.platform(), "cpus": os.cpu_count(), "mb_per_checkpoint": args.mb,
                 "keep": args.keep}
    with tempfile.TemporaryDirectory(prefix="kit-bench-") as tmp:
        ckpts = [make_ckpt(Path(tmp) / "local", s, args.mb) for s in range(1, args.keep + 2)]
        out["directory"] = publishes(DirStore(Path(tmp) / "store"), ckpts, args.keep)
        with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
            hub.lfs_threshold = 1 << 20
            out["hub"] = publishes(HubStore("me/bench", token=WRITE_TOKEN, endpoint=hub.url), ckpts, args.keep)
    out["silent_endpoint"] = silent_status(args.silent_timeout)
    Path(args.o).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
