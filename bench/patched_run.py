"""Run a rendered train_ddp.py with one speed-up patched in that kit does not choose yet.

bench/speed.py measures a candidate this way before the planner may pick it (issue #17: "keep each
only where the benchmark shows it pays"), so no product code is written for a speed-up that loses:

    python bench/patched_run.py offload kit_liger.py [script args]   # TRL's activation_offloading
    python bench/patched_run.py compile kit_liger.py [script args]   # torch.compile each decoder layer

- offload: `SFTConfig(activation_offloading=True)`: TRL moves the tensors autograd saves to pinned
  CPU memory on a side stream and brings them back for the backward pass (torchtune's
  OffloadActivations); with gradient checkpointing those are the decoder layers' inputs.
- compile: after `SFTTrainer` is built, `module.compile()` on every `*DecoderLayer` (the unit that
  repeats; the 4-bit matmuls are bitsandbytes' registered custom ops). The session record's step
  time is the median of the steps after the first two, so compilation is outside it.
"""

from __future__ import annotations

import runpy
import sys

PATCHES = ("offload", "compile")


def _offload() -> None:
    import trl

    init = trl.SFTConfig.__init__

    def patched(self, *args, **kwargs):
        kwargs["activation_offloading"] = True
        init(self, *args, **kwargs)

    trl.SFTConfig.__init__ = patched


def _compile() -> None:
    import trl

    init = trl.SFTTrainer.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        layers = [m for m in self.model.modules() if type(m).__name__.endswith("DecoderLayer")]
        for layer in layers:
            layer.compile()
        print(f"[bench] torch.compile on {len(layers)} decoder layers", flush=True)

    trl.SFTTrainer.__init__ = patched


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in PATCHES:
        raise SystemExit(f"usage: python bench/patched_run.py {{{'|'.join(PATCHES)}}} SCRIPT [ARGS]")
    patch, script = sys.argv[1], sys.argv[2]
    {"offload": _offload, "compile": _compile}[patch]()
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
