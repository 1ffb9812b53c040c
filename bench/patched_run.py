"""Run a rendered train_ddp.py with one speed-up patched in that kit does not choose yet.

bench/speed.py measures a candidate this way before the planner may pick it (issue #17: "keep each
only where the benchmark shows it pays"), so no product code is written for a speed-up that loses:

    python bench/patched_run.py compile kit_liger.py [script args]   # torch.compile each decoder layer
    python bench/patched_run.py probe kit_unsloth.py [script args]   # bench/trainer_probe.py: prints only
    KIT_GRADS_OUT=g.json python bench/patched_run.py grads kit.py    # bench/compile_grads.py: records only

(TRL's activation offloading was measured here too, and is now kit's `activation_offloading`.)
- compile: after `SFTTrainer` is built, `module.compile()` on every `*DecoderLayer` (the unit that
  repeats; the 4-bit matmuls are bitsandbytes' registered custom ops). The session record's step
  time is the median of the steps after the first two, so compilation is outside it.
  (The earlier `compile_nonorm` row, the same with Liger's RMSNorm left to inductor, is now kit's own
  `compile=on`: bench/speed.py's `liger_offload_compile_on` row runs it through the script.)
"""

from __future__ import annotations

import runpy
import sys

PATCHES = ("compile", "probe", "grads")


def _compile(script: str) -> None:
    """Compiled layers without kit's eager rounding: how the cold-cache runs measured compile."""
    import trl

    from kit.train import modeling

    init = trl.SFTTrainer.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        layers = modeling.decoder_layers(self.model)
        for layer in layers:
            layer.compile()
        print(f"[bench] torch.compile on {len(layers)} decoder layers", flush=True)

    trl.SFTTrainer.__init__ = patched


def _probe(script: str) -> None:
    import importlib
    from pathlib import Path

    if "import unsloth" in Path(script).read_text():  # Unsloth patches transformers only when it comes first
        importlib.import_module("unsloth")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench import trainer_probe

    trainer_probe.install()


def _grads(script: str) -> None:
    """Before each optimizer step, each trainable tensor's gradient: its norm, its exact zeros and
    its size, written to $KIT_GRADS_OUT as JSON when the process ends (bench/compile_grads.py);
    with $KIT_GRADS_TENSORS, the first step's gradients themselves too (torch.save, on the CPU)."""
    import atexit
    import json
    import os

    import torch
    import transformers

    steps: list[dict] = []
    create = transformers.Trainer.create_optimizer

    def patched(self, *args, **kwargs):
        optimizer = create(self, *args, **kwargs)
        names = {id(p): n for n, p in self.model.named_parameters() if p.requires_grad}

        def record(opt, *_):
            seen = {}
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        g = p.grad.detach().float()
                        seen[names.get(id(p), str(id(p)))] = [g.norm().item(), int((g == 0).sum()), g.numel(),
                                                              str(p.dtype)]
            if not steps and os.environ.get("KIT_GRADS_TENSORS"):
                torch.save({names.get(id(p), str(id(p))): p.grad.detach().float().cpu()
                            for group in opt.param_groups for p in group["params"] if p.grad is not None},
                           os.environ["KIT_GRADS_TENSORS"])
            steps.append(seen)

        optimizer.register_step_pre_hook(record)
        return optimizer

    transformers.Trainer.create_optimizer = patched
    atexit.register(lambda: open(os.environ["KIT_GRADS_OUT"], "w").write(json.dumps({"steps": steps})))


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in PATCHES:
        raise SystemExit(f"usage: python bench/patched_run.py {{{'|'.join(PATCHES)}}} SCRIPT [ARGS]")
    patch, script = sys.argv[1], sys.argv[2]
    {"compile": _compile, "probe": _probe, "grads": _grads}[patch](script)
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
