"""Two "nodes" on one machine: two real torchrun agents, `--nnodes 2`, one rank each, torchrun's
c10d rendezvous on localhost, each node its own output_dir, the test Hub as the shared store.

Node 1 is given another Hub endpoint, a second server that must see no request at all: only
global rank 0 may talk to the store."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.hubserver import WRITE_TOKEN, HubServer
from tests.scripts import FAST, ROOT, SCRIPT, cpu_env, kill_job

STORE = "store=hf://me/two-nodes"


@pytest.fixture
def hubs():
    with HubServer(tokens={WRITE_TOKEN: "write"}) as store, HubServer(tokens={WRITE_TOKEN: "write"}) as trap:
        yield store, trap


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent(node: int, port: int, hub, out: Path, args: list[str], log: Path) -> subprocess.Popen:
    env = cpu_env(HF_ENDPOINT=hub.url, HF_TOKEN=WRITE_TOKEN, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", f"--node_rank={node}",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=kit-test", "--max_restarts=0",
           str(SCRIPT), f"output_dir={out / f'node{node}'}", STORE, *args]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def both(tmp_path: Path, hubs, args: list[str], tag: str, timeout: float = 240):
    store, trap = hubs
    port = free_port()
    logs = [tmp_path / f"{tag}-node{n}.log" for n in (0, 1)]
    procs = [agent(0, port, store, tmp_path, args, logs[0]), agent(1, port, trap, tmp_path, args, logs[1])]
    return procs, logs


def wait_all(procs, timeout: float = 240) -> list[int]:
    deadline = time.monotonic() + timeout
    for p in procs:
        p.wait(timeout=max(1, deadline - time.monotonic()))
    return [p.returncode for p in procs]


def newer_than(folder: Path, step: int) -> bool:
    return any(int(p.name.split("-")[1]) > step and (p / "kit_manifest.json").exists()
               for p in folder.glob("checkpoint-*"))


@pytest.mark.slow
def test_two_nodes_train_push_from_rank_0_survive_a_dead_node_and_resume(hubs, tmp_path):
    store, trap = hubs
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    # 1. A long run; once rank 0 has saved past step 5, node 1 dies (kill -9 of its agent and worker): node 0 must
    # exit non-zero, fast. Two launches in all: the rerun below is the run to the end that saves and pushes.
    procs, logs = both(tmp_path, hubs, ["max_steps=400", "save_steps=5", *FAST], "cut")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not newer_than(node0, 5):
        assert procs[0].poll() is None, f"{sorted(p.name for p in node0.iterdir())} {logs[0].read_text()[:3000]}"
        time.sleep(0.05)
    assert newer_than(node0, 5), logs[0].read_text()[-2000:]
    kill_job(procs[1], str(node1))
    killed = time.monotonic()
    procs[0].wait(timeout=90)
    took = time.monotonic() - killed
    assert procs[0].returncode != 0, logs[0].read_text()[-2000:]
    assert took <= 60, f"node 0 took {took:.0f} s to notice its dead peer"
    cut = max(int(p.name.split("-")[1]) for p in node0.glob("checkpoint-*") if (p / "kit_manifest.json").exists())
    assert cut < 20, cut

    # 2. Rerun both to the end: rank 0 resumes from its newest checkpoint, node 1 receives its files from rank 0;
    # rank 0 (node 0) saves and pushes, node 1 keeps only its own RNG state and says nothing else.
    procs, logs = both(tmp_path, hubs, ["max_steps=20", "save_steps=5", *FAST], "rerun")
    codes = wait_all(procs)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], text[0][-2000:] + text[1][-2000:]
    assert "resuming from step" in text[0] and "[kit] complete: step 20 of 20" in text[0]
    assert "file(s) of checkpoint-" in text[1] and "received from rank 0" in text[1]
    assert "[kit] plan: fp32, 2 × cpu" in text[0] and "[kit] store: step 20 published" in text[0]
    assert "[kit]" not in text[1].replace("[kit] rank 1", "")  # node 1 says nothing: rank 0 speaks for the job
    assert "checkpoint-20/adapter_model.safetensors" in str(sorted(store.files("me/two-nodes")))
    assert trap.requests == [], "a rank other than global rank 0 talked to the store"
    assert (node0 / "checkpoint-20" / "adapter_model.safetensors").exists()
    assert {p.name for p in (node1 / "checkpoint-20").iterdir()} == {"rng_state_1.pth"}
