"""How long after a kill -9 a session on another host takes the store's lease over.

A holder process takes the lease of a Hub store on tests/hubserver.py (an independent Hub
emulator speaking the real protocol) and heartbeats; it is killed with SIGKILL at a random moment
of its heartbeat cycle; a newcomer that names another host (what every new Kaggle session is)
tries to take the lease once a second until it gets it.

    python bench/lease_takeover.py                       # kit's defaults: 60 s heartbeat, 3 missed
    python bench/lease_takeover.py --heartbeat 200 --missed 3   # the old 10-minute TTL
    python bench/lease_takeover.py --out bench/results/lease_takeover.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOLDER = """
import sys, time
from kit.checkpoints.lease import Lease
from kit.checkpoints.store.hub import HubStore
lease = Lease(HubStore("me/lease-bench", token=sys.argv[2], endpoint=sys.argv[1]), "host-a pid 1",
              heartbeat_s=float(sys.argv[3]), missed=int(sys.argv[4])).acquire()
lease.keep_alive()
print("held", flush=True)
time.sleep(10**6)
"""


def measure(url: str, token: str, heartbeat_s: float, missed: int, seed: int) -> dict:
    from kit.errors import StoreError
    from kit.checkpoints.lease import Lease
    from kit.checkpoints.store.hub import HubStore

    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_DISABLE_TELEMETRY="1")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, url, token, str(heartbeat_s), str(missed)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        time.sleep(random.Random(seed).uniform(0, heartbeat_s) + heartbeat_s)  # a random moment of the cycle
        holder.send_signal(signal.SIGKILL)
        killed = time.time()
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
    refused = 0
    while True:
        try:
            lease = Lease(HubStore("me/lease-bench", token=token, endpoint=url), "host-b pid 2",
                          heartbeat_s=heartbeat_s, missed=missed).acquire()
            break
        except StoreError:
            refused += 1
            time.sleep(1.0)
    took = time.time() - killed
    last_beat = float(lease.took_over["heartbeat"])
    lease.release()
    return {"heartbeat_s": heartbeat_s, "missed": missed, "kill_to_takeover_s": round(took, 1),
            "last_heartbeat_before_kill_s": round(killed - last_beat, 1), "refused_attempts": refused}


def main() -> int:
    from tests.hubserver import WRITE_TOKEN, HubServer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heartbeat", type=float, default=60.0)
    p.add_argument("--missed", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    runs = []
    with HubServer(tokens={WRITE_TOKEN: "write"}) as hub:
        for i in range(args.repeats):
            runs.append(measure(hub.url, WRITE_TOKEN, args.heartbeat, args.missed, seed=i))
            print(json.dumps(runs[-1]), flush=True)
    result = {"bench": "lease_takeover", "hub": "tests/hubserver.py", "runs": runs,
              "bound_s": args.heartbeat * args.missed}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
