"""How much does a background checkpoint upload slow the training loop?

    python bench/sync_overhead.py                      # writes bench/results/sync_overhead_cpu.json
    python bench/sync_overhead.py --mb 150 --mbps 50 --mode lfs --threads 1 --rounds 3

A CPU loop stands in for training (a fixed matmul workload, ~100 ms a step) while
``kit.checkpoints.sync.BackgroundSync`` publishes a checkpoint of random bytes through the real
``huggingface_hub`` client to ``tests/hubserver.py``, run in a separate process (as the Hub is a
separate machine) and throttled to ``--mbps``. Steps are timed before any upload (baseline) and
while one is in flight (manifest hashing in the worker included); overhead = mean in-flight step / mean baseline step - 1.

``--threads 1`` (default) leaves the second core to the uploader, as on a GPU run where the
training thread mostly waits on the GPU; ``--threads 0`` lets torch take every core too.
``--mode lfs`` streams files with PUT (what large files do on the Hub, minus Xet, which cannot be
served here); ``--mode regular`` sends them base64-encoded inside the commit (the worst case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_XET"] = "1"  # before huggingface_hub is imported: LFS instead of Xet
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kit.checkpoints.manifest import write_manifest  # noqa: E402
from kit.checkpoints.store.hub import HubStore  # noqa: E402
from kit.checkpoints.sync import BackgroundSync  # noqa: E402

TOKEN = "hf_benchWRITEtoken"
SERVER = """
import sys, time
sys.path.insert(0, {root!r})
from tests.hubserver import HubServer
s = HubServer(tokens={{{token!r}: "write"}}).start()
s.throttle_bps = {bps}
s.lfs_threshold = {lfs}
print(s.url, flush=True)
sys.stdin.read()
"""


def make_step(threads: int, target_s: float):
    if threads:
        torch.set_num_threads(threads)
    a = torch.randn(512, 512)
    b = torch.randn(512, 512)
    c = torch.empty(512, 512)

    def one() -> None:
        for _ in range(reps):  # same inputs every time: no data-dependent (denormal) timing
            torch.mm(a, b, out=c)

    reps = 1
    for _ in range(4):  # rescale until one call takes target_s
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            one()
            times.append(time.perf_counter() - t0)
        reps = max(1, round(reps * target_s / statistics.median(times)))
    return one


def make_checkpoints(root: Path, mb: int, rounds: int, manifest_before: bool) -> list[Path]:
    """One checkpoint of random bytes per round (distinct bytes: the Hub dedups identical LFS objects)."""
    sizes = {"adapter_model.safetensors": mb // 3, "optimizer.pt": mb - mb // 3}
    out = []
    for r in range(rounds):
        ckpt = root / f"checkpoint-{100 + r}"
        shutil.rmtree(ckpt, ignore_errors=True)
        ckpt.mkdir(parents=True)
        for name, size in sizes.items():
            with open(ckpt / name, "wb") as f:
                for _ in range(size):
                    f.write(os.urandom(1 << 20))
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 100 + r}))
        if manifest_before:
            write_manifest(ckpt, 100 + r, 1, {"model": "bench"})
        out.append(ckpt)
    return out


def run(args) -> dict:
    bps = args.mbps * 1_000_000
    lfs = 1_000_000 if args.mode == "lfs" else None
    server = subprocess.Popen([sys.executable, "-c", SERVER.format(root=str(ROOT), token=TOKEN, bps=bps, lfs=lfs)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    url = server.stdout.readline().strip()
    work = Path(args.workdir)
    ckpts = make_checkpoints(work, args.mb, args.rounds, args.manifest == "before")
    nbytes = sum(p.stat().st_size for p in ckpts[0].iterdir())
    step = make_step(args.threads, args.step_s)
    load_before = os.getloadavg()[0]
    store = HubStore("bench/sync", token=TOKEN, endpoint=url, timeout_s=120)
    store.ensure_repo()
    sync = BackgroundSync(store, keep=2)

    def timed_steps(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            out.append(time.perf_counter() - t0)
        return out

    timed_steps(5)  # warm-up
    baseline, inflight, uploads, submit_ms = [], [], [], []
    for r in range(args.rounds):
        baseline += timed_steps(args.baseline_steps)
        t0 = time.perf_counter()
        step()
        # --manifest worker: the worker hashes the files and writes the manifest into its staged
        # copy, inside the in-flight window; before: sealed earlier by the loop (kit/train/callbacks.py).
        if args.manifest == "worker":
            sync.submit(ckpts[r], 100 + r, world_size=1, fingerprint={"model": "bench"})
        else:
            sync.submit(ckpts[r], 100 + r)
        submit_ms.append((time.perf_counter() - t0) * 1000)
        while sync.busy:
            t0 = time.perf_counter()
            step()
            inflight.append(time.perf_counter() - t0)
        sync.wait(0)
        uploads.append(sync.last_upload_s)
    sync.close(60)
    server.stdin.close()
    server.wait(10)
    base, fly = statistics.mean(baseline), statistics.mean(inflight)
    return {
        "mode": args.mode, "manifest": args.manifest, "torch_threads": torch.get_num_threads(), "checkpoint_mb": round(nbytes / 1e6, 1),
        "throttle_mb_per_s": args.mbps, "rounds": args.rounds,
        "baseline_step_ms": {"mean": round(base * 1000, 2), "median": round(statistics.median(baseline) * 1000, 2),
                             "n": len(baseline)},
        "inflight_step_ms": {"mean": round(fly * 1000, 2), "median": round(statistics.median(inflight) * 1000, 2),
                             "max": round(max(inflight) * 1000, 2), "n": len(inflight)},
        "overhead_pct": round((fly / base - 1) * 100, 2),
        "submit_ms": [round(x, 1) for x in submit_ms],
        "upload_s": [round(x, 2) for x in uploads],
        "upload_mb_per_s": round(nbytes / 1e6 / statistics.mean(uploads), 1),
        "errors": [str(e) for e in sync.errors],
        "loadavg_1min_before": round(load_before, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=150)
    p.add_argument("--mbps", type=float, default=50)
    p.add_argument("--mode", choices=["lfs", "regular"], default="lfs")
    p.add_argument("--manifest", choices=["worker", "before"], default="worker",
                   help="who hashes the checkpoint: the upload worker (in the window) or the loop before")
    p.add_argument("--threads", type=int, default=1, help="torch threads; 0 = torch's default")
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline-steps", type=int, default=30)
    p.add_argument("--workdir", default="/tmp/kit-bench-sync")
    p.add_argument("--out", default=str(ROOT / "bench/results/sync_overhead_cpu.json"))
    p.add_argument("--append", action="store_true", help="add this run to the runs already in --out")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1))
    out = Path(args.out)
    doc = json.loads(out.read_text()) if args.append and out.exists() else {"runs": []}
    doc["machine"] = {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
    doc["runs"].append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
