"""Host RAM while the model loads: what each rank holds, summed over one node's ranks.

    need = node_load_bytes(model_facts("Qwen/Qwen3-14B"), "fsdp", quantized=False, ranks=2)
    need.total_bytes, load_words(need.figures())   # ~32.5 GiB, "its first rank reads the 27.5 GiB of 16-bit weights ..."

Kaggle gives ~31 GiB of RAM to both T4 ranks together: a plan whose load does not fit there is
killed by the kernel's OOM killer before the first step, so the planner counts it. Loading is
the peak: training itself keeps the weights on the GPUs. A machine whose RAM is not known (a
`--gpus` machine other than Kaggle's and Colab's, facts without ram_bytes) is not checked.

What each rank holds (numbers are kit's assumptions, not measurements):
- every rank: the Python process with torch, CUDA, transformers and TRL imported (PROCESS_BYTES);
- a rank loading to its GPU (DDP, single, QLoRA under FSDP, model parallel): the tensors on
  their way from the memory-mapped safetensors shard to the GPU (IN_FLIGHT_BYTES at most; the
  mapped file itself is page cache the kernel can drop, not the process's own memory);
- 16-bit LoRA under FSDP: the node's first rank reads the whole 16-bit model into RAM and
  broadcasts it while sharding, the node's other ranks build theirs on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.files import GIB

PROCESS_BYTES = 5 * GIB // 2
IN_FLIGHT_BYTES = 2 * GIB
HEADROOM = 0.9  # of the machine's RAM: the OS, the notebook kernel and the page cache need the rest


@dataclass(frozen=True)
class HostLoad:
    total_bytes: int
    first_rank_reads: bool  # 16-bit FSDP: the node's first rank reads the whole 16-bit model into RAM
    ranks: int
    per_rank_bytes: int     # what each rank holds (besides the first rank's read)
    weights_bytes: int      # the 16-bit (full fine-tuning: 32-bit) weights

    def figures(self) -> dict:
        """The load as a Reason's figures (GiB), which `load_words` reads."""
        return {"load_gib": self.total_bytes / GIB, "first_rank_reads": self.first_rank_reads, "ranks": self.ranks,
                "per_rank_gib": self.per_rank_bytes / GIB, "weights_gib": self.weights_bytes / GIB}


def load_words(f: dict) -> str:
    """What the load is made of, from `HostLoad.figures()`: the words of the plan's host RAM reason
    (kit.report.reasons) and of the refusal that names a strategy passed over for it (kit.planning.fit)."""
    if f["first_rank_reads"]:
        return (f"its first rank reads the {f['weights_gib']:.1f} GiB of 16-bit weights into RAM and the others "
                f"receive them while sharding, plus {f['per_rank_gib']:.1f} GiB per process")
    each = (f"{f['ranks']} processes of ~{f['per_rank_gib']:.1f} GiB each" if f["ranks"] > 1 else
            f"1 process of ~{f['per_rank_gib']:.1f} GiB")
    return f"{each}: torch and CUDA, plus the weights on their way to the GPU"


def node_load_bytes(model, strategy: str, quantized: bool, ranks: int, full_method: bool = False) -> HostLoad:
    """Peak host RAM of one node while `ranks` processes load `model` for `strategy`."""
    weights16 = model.params * (4 if full_method else 2)
    if strategy == "fsdp" and not quantized:
        return HostLoad(int(ranks * PROCESS_BYTES + weights16), True, ranks, PROCESS_BYTES, weights16)
    per_rank = PROCESS_BYTES + min(weights16, IN_FLIGHT_BYTES)
    return HostLoad(int(ranks * per_rank), False, ranks, per_rank, weights16)


def budget(ram_bytes: int | None) -> int | None:
    return None if not ram_bytes else int(ram_bytes * HEADROOM)
