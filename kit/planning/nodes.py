"""The same job on several machines: torchrun's own multi-node rendezvous, and the few lines
that SLURM and SkyPilot need to start it.

    commands(2, 2, "10.0.0.1:29500", "kit-run")
    # ['torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --rdzv_backend=c10d --rdzv_endpoint=10.0.0.1:29500 ...',
    #  '... --node_rank=1 ...']

Every node runs the same train_ddp.py. torchrun's c10d rendezvous (the store lives in the agent
on the endpoint's host) gives each worker its global RANK; in the script only global rank 0
talks to the checkpoint store, each node's first rank downloads the model and data into the
node's own cache, and each node writes its own output_dir. A node that dies takes the job down:
its peers' collectives fail and their agents exit non-zero (`--max_restarts=0`); the rerun
resumes from the newest checkpoint.
"""

from __future__ import annotations

import re

from kit.errors import UsageError

DEFAULT_PORT = 29500
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+|\$[A-Z_]+):([0-9]{1,5})$")


def check_endpoint(endpoint: str) -> str:
    """`endpoint` if it is HOST:PORT (a name, an IPv4, [IPv6], or $VARIABLE for the host)."""
    m = _ENDPOINT.match(endpoint or "")
    if not m or not 0 < int(m.group(2)) < 65536:
        raise UsageError(f"rendezvous endpoint {endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:{DEFAULT_PORT}): give "
                         "the address of node 0 and a free port")
    return endpoint


MAX_NODES = 1024


def check_nodes(nodes: int, node_rank: int | None = None, endpoint: str | None = None,
                nproc: int | None = None) -> None:
    """Refuse a node count, node rank, endpoint or processes per node that cannot start a job."""
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
        raise UsageError(f"--nproc {nproc}: use at least 1 process")
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes {nodes}: a job runs on 1 to {MAX_NODES} nodes")
    if nodes == 1 and (node_rank is not None or endpoint is not None):
        flag = "--node-rank" if node_rank is not None else "--rdzv-endpoint"
        raise UsageError(f"{flag} is for a job over several machines: add --nodes N (N >= 2), or leave it out")
    if node_rank is not None and not 0 <= node_rank < nodes:
        raise UsageError(f"--node-rank {node_rank}: node ranks run from 0 to {nodes - 1} for --nodes {nodes}")


def commands(nodes: int, nproc: int, endpoint: str, run_id: str, script: str = "train_ddp.py") -> list[str]:
    """One torchrun command per node, node 0 first."""
    check_nodes(nodes)
    check_endpoint(endpoint)
    return [f"torchrun --nnodes={nodes} --nproc_per_node={nproc} --node_rank={rank} --rdzv_backend=c10d "
            f"--rdzv_endpoint={endpoint} --rdzv_id={run_id} --max_restarts=0 {script}" for rank in range(nodes)]


def slurm(nodes: int, nproc: int, run_id: str, port: int = DEFAULT_PORT, script: str = "train_ddp.py") -> str:
    """An sbatch script: one torchrun per node, the first node of the allocation hosts the rendezvous."""
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={run_id}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "head=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        f"srun torchrun --nnodes={nodes} --nproc_per_node={nproc} --node_rank=\"$SLURM_NODEID\" "
        f"--rdzv_backend=c10d --rdzv_endpoint=\"$head:{port}\" --rdzv_id=\"$SLURM_JOB_ID\" --max_restarts=0 {script}",
    ])


def skypilot(nodes: int, nproc: int, accelerator: str | None, port: int = DEFAULT_PORT,
             script: str = "train_ddp.py") -> str:
    """A SkyPilot task: SkyPilot sets the node rank and the head node's address on every node.

    `accelerator`: SkyPilot's name of the GPU (kit.machine.gpu_table.skypilot_name), or None when
    kit does not know it: the task then says so where the name goes.
    """
    wanted = (f"{accelerator}:{nproc}" if accelerator else
              f"GPU:{nproc}  # replace GPU with SkyPilot's name of this GPU (`sky show-gpus`); kit's table lacks it")
    return "\n".join([
        f"num_nodes: {nodes}",
        "resources:",
        f"  accelerators: {wanted}",
        "run: |",
        "  head=$(echo \"$SKYPILOT_NODE_IPS\" | head -n 1)",
        f"  torchrun --nnodes={nodes} --nproc_per_node={nproc} --node_rank=\"$SKYPILOT_NODE_RANK\" "
        f"--rdzv_backend=c10d --rdzv_endpoint=\"$head:{port}\" --max_restarts=0 {script}",
    ])
