"""`kit export`: merge a LoRA adapter into 16-bit weights that load with `AutoModelForCausalLM` alone.

Facts first (`prepare`: the adapter, its base, the base's revision, the disk it needs and has),
then the merge (`merge`), then the check (`verify`). For QLoRA the base is reloaded in 16-bit
from its original weights and merged there: merging into 4-bit weights would round the update
away and save a model that is neither. The base is loaded on the CPU (a Kaggle T4 cannot hold an
8B model in 16-bit); it takes the model's 16-bit size in RAM, once: the check loads the merged
model only after the merge is freed.

Verification (kit/deliver/merge_check.py says why and how it was measured): the merged model's
logits on a few prompts against base + adapter unmerged computed in fp32 arithmetic; its RMS error
must stay within 1.25× that of base + adapter unmerged in the export's own dtype (the error 16-bit
inference has anyway; a correct merge measured 1.01× on the 8B shape), and the greedy next token
must agree wherever the reference's top-1 token is not a near-tie. The check refuses a dropped adapter, a doubled scaling, a module type left out and
a merge into 4-bit weights, whenever the adapter moves the logits by more than 16-bit noise does.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kit.deliver import merge_check
from kit.deliver.export_inputs import base_location, check_out_dir, prompt_texts, read_adapter, sixteen_bit_bytes
from kit.errors import CannotTrain, UsageError
from kit.files import free_bytes, is_disk_full, read_text, size_words
from kit.train.modeling import weights_problem
from kit.evaluation import identity

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
SHARD = "2GB"  # small shards: each is written (and later read) without a second copy of the model
MARGIN = 256 << 20  # tokenizer, config, card, filesystem slack
FALLBACK_PROMPTS = ["Hello, how are you?", "Write one sentence about the sea.",
                    "List three things a good recipe says before the steps begin, and why each matters."]


@dataclass
class ExportPlan:
    adapter: str
    base: str
    base_dir: str
    base_revision: str
    recorded_revision: str | None
    out: str
    dtype: str
    need_bytes: int
    free_bytes: int
    warnings: list

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_base(name: str, revision: str | None, what: str = "the base model") -> Path:
    """A local folder holding the base's config, tokenizer and weights (the Hub cache for a Hub id).

    Raises:
        UsageError: a Hub base that is neither cached nor downloadable (offline, or missing).
    """
    if Path(name).is_dir():
        return Path(name)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from kit.checkpoints.store.hub_http import hub_offline

    offline = hub_offline()
    patterns = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]
    try:
        return Path(snapshot_download(name, revision=revision, allow_patterns=patterns, local_files_only=offline))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        how = ("it is not in the Hugging Face cache and HF_HUB_OFFLINE is set: run once with HF_HUB_OFFLINE=0, "
               "or pass --base PATH to a local copy") if offline else f"{str(e).splitlines()[0][:200]}"
        raise UsageError(f"{what} is not available: {how}") from None


def prepare(adapter_dir, out_dir, *, base: str | None = None, dtype: str = "bf16", gguf_type: str | None = None,
            force: bool = False) -> ExportPlan:
    """Everything checked before a byte is written: adapter, base, revision, output, disk."""
    adapter_cfg, run = read_adapter(adapter_dir)
    if adapter_cfg.get("use_dora"):
        raise UsageError(f"{adapter_dir} is a DoRA adapter: kit export merges plain LoRA only")
    name, what = base_location(base, adapter_cfg, adapter_dir)
    out = Path(out_dir)
    check_out_dir(out)  # before the base is looked up or downloaded
    base_dir = resolve_base(name, adapter_cfg.get("revision"), what)
    current = identity.base_revision(str(base_dir)) if Path(name).is_dir() else f"hub:{base_dir.name}"
    warnings = []
    warning = identity.check_same_base(run.get("base_revision"), current, f"adapter {adapter_dir}", force)
    if warning:
        warnings.append(warning)
    sixteen = sixteen_bit_bytes(base_dir)
    need = sixteen * (2 if dtype == "fp32" else 1) + MARGIN
    if gguf_type:
        from kit.deliver.gguf import gguf_bytes

        need += gguf_bytes(gguf_type, sixteen)
    free = free_bytes(out)
    if free < need:
        raise CannotTrain(f"export needs ~{need / 1e9:.1f} GB free where {out} goes, only {free / 1e9:.1f} GB is: "
                          "pick -o on a larger disk (on Kaggle /tmp, not /kaggle/working's ~20 GB)")
    return ExportPlan(str(adapter_dir), name, str(base_dir), current, run.get("base_revision"), str(out), dtype,
                      need, free, warnings)


def prompts_for(adapter_dir, tokenizer, n: int = 3) -> list[list[int]]:
    """A few held-out prompts from the job's eval_results.json, else fixed sentences; as token ids."""
    texts = prompt_texts(adapter_dir, n) or FALLBACK_PROMPTS
    return [tokenizer(t, add_special_tokens=False)["input_ids"] or [0] for t in texts]


def merge(plan: ExportPlan) -> dict:
    """Merge, save sharded safetensors + tokenizer into plan.out (via a temp folder), then verify."""
    import torch
    from peft import PeftModel
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, DTYPES[plan.dtype])
    out = Path(plan.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    timings = {}
    try:
        started = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(plan.adapter)
        try:
            model = AutoModelForCausalLM.from_pretrained(plan.base_dir, dtype=dtype)  # 16-bit, CPU: never 4-bit
        except (OSError, ValueError, RuntimeError, SafetensorError) as e:
            if (why := weights_problem(e)) is None:
                raise
            raise UsageError(f"base model {plan.base_dir} does not load ({why}): restore it or give another "
                             "--base") from None
        try:  # the adapter's shapes or target modules may not be this base's (a hand-edited or other adapter)
            model = PeftModel.from_pretrained(model, plan.adapter)
        except (RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as e:
            why = " ".join(line.strip() for line in str(e).strip().splitlines()[:2]) or type(e).__name__
            raise UsageError(f"--adapter {plan.adapter} does not load onto {plan.base_dir}: {why[:320]}") from None
        model.eval()
        prompts = prompts_for(plan.adapter, tokenizer)
        same_dtype = merge_check.logits(model, prompts)
        with merge_check.fp32_compute(model):
            reference = merge_check.logits(model, prompts)
        timings["load_s"] = time.monotonic() - started
        started = time.monotonic()
        merged = model.merge_and_unload()
        merged.save_pretrained(tmp, max_shard_size=SHARD)
        tokenizer.save_pretrained(tmp)
        _card(Path(plan.adapter), tmp)
        timings["merge_save_s"] = time.monotonic() - started
        del model, merged
        gc.collect()
        started = time.monotonic()
        check = verify(tmp, prompts, reference, same_dtype, plan.dtype)
        timings["verify_s"] = time.monotonic() - started
        os.rename(tmp, out)
    except Exception as e:  # safetensors' and torch's errors wrap the OSError of a full disk
        if not is_disk_full(e, out.parent):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise CannotTrain(f"export ran out of disk space in {out.parent} ({size_words(free_bytes(out.parent))} free) "
                          "while writing the merged model: nothing was kept; pick -o on a larger disk") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**check, **{k: round(v, 2) for k, v in timings.items()}}


def _card(adapter: Path, out: Path) -> None:
    """The job's model card, now for plain transformers weights."""
    card = adapter / "README.md"
    if card.is_file():
        text = read_text(card, "model card").replace("library_name: peft", "library_name: transformers", 1)
        (out / "README.md").write_text(text.replace("- peft\n", "- merged\n", 1))


def verify(folder, prompts, reference, same_dtype, dtype: str) -> dict:
    """Load `folder` with plain AutoModelForCausalLM and judge its logits (kit.deliver.merge_check.judge).

    `reference`: base + adapter unmerged, fp32 arithmetic; `same_dtype`: the same in `dtype`, the noise yardstick.

    Raises:
        KitError: the merged model disagrees beyond the tolerance (nothing is kept then).
    """
    import torch
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, DTYPES[dtype]))
    merged.eval()
    result = merge_check.judge(merge_check.logits(merged, prompts), reference, same_dtype)
    result["prompts"] = len(prompts)
    if not result["passed"]:
        from kit.errors import KitError

        agree = result["top1_agreement"]
        raise KitError(f"the merged model does not match base + adapter: RMS logit error "
                       f"{result['rms_logit_error']:.3g} against {result['rms_noise_16bit_unmerged']:.3g} for "
                       f"{dtype} inference unmerged (tolerance {result['tolerance']:.3g}), greedy agreement "
                       f"{'n/a' if agree is None else f'{100 * agree:.1f} %'} at {result['top1_positions_counted']} "
                       "clear positions; nothing was kept", 1)
    return result
