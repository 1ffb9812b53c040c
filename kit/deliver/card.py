"""The model card (README.md) of a finished job: YAML metadata the Hub reads, then what a user needs.

The YAML follows the Hub's model card metadata: `base_model` (a Hub id; a local base is named in
the text only, as the Hub rejects a path there), `library_name: peft`, `tags`, `datasets` (a Hub
dataset id), `license` (taken from the base model's own card when it has one), plus
`base_model_revision`, the exact weights the adapter belongs to.
"""

from __future__ import annotations

import re
from pathlib import Path

from kit.evaluation.results import change_line, words
from kit.train.rewards import parse_spec


def _hub_id(name: str) -> bool:
    return not Path(name).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None


def base_license(model: str) -> str | None:
    """`license:` of a local base model's README.md front matter, when it has one."""
    card = Path(model) / "README.md"
    if not card.is_file():
        return None
    m = re.search(r"^---\n(.*?)\n---", card.read_text(errors="replace"), re.S)
    found = re.search(r"^license:\s*(\S+)", m.group(1), re.M) if m else None
    return found.group(1) if found else None


def metadata(cfg, run: dict) -> dict:
    meta = {}
    if _hub_id(cfg.model):
        meta["base_model"] = cfg.model
    meta["base_model_revision"] = run.get("base_revision")
    meta["library_name"] = "peft" if cfg.method != "full" else "transformers"
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = ["kit", "trl", cfg.trainer] + ([cfg.method, "peft"] if cfg.method != "full" else ["full-fine-tune"])
    if _hub_id(cfg.data.path):
        meta["datasets"] = [cfg.data.path]
    lic = base_license(cfg.model)
    if lic:
        meta["license"] = lic
    return meta


def render(cfg, run: dict, results: dict, facts: dict) -> str:
    """README.md text. `facts`: plan words, hardware, sessions, gpu_hours, command, hub_repo, final_dir."""
    import yaml

    b, f = results.get("baseline"), results.get("final")
    repo = facts.get("hub_repo")
    where = f'"{repo}", subfolder="final"' if repo else f'"{facts.get("final_dir", "final")}"'
    lora = (f"LoRA r={cfg.lora.r}, alpha={cfg.lora.alpha:g}, dropout={cfg.lora.dropout:g}, "
            f"target modules {cfg.lora.target_modules}") if cfg.method != "full" else "all weights"
    lines = [
        "---", yaml.safe_dump(metadata(cfg, run), sort_keys=False).rstrip(), "---", "",
        f"# {Path(cfg.output_dir).name}: {cfg.method} fine-tune of {cfg.model}", "",
        f"Run `{run.get('run_id')}`, trained with kit (TRL {TRAINER_NAMES[cfg.trainer]} + PEFT).", "",
        "## What it is", "",
        f"- Base model: `{cfg.model}`, revision `{run.get('base_revision')}`"
        + (f" (asked for `{cfg.revision}`)" if cfg.revision else ""),
        f"- Data: `{cfg.data.path}` ({results['data'].get('format')}, fingerprint `{results['data']['fingerprint']}`), "
        f"{cfg.data.eval_fraction:g} held out for evaluation",
        *([f"- Trainer: {cfg.trainer} ({_trainer_words(cfg)})"] if cfg.trainer != "sft" else []),
        f"- Method: {cfg.method}, {lora}; seq_len {cfg.seq_len}, learning rate {cfg.learning_rate:g} "
        f"({cfg.lr_scheduler}), {results.get('step')} steps",
        f"- Plan and hardware: {facts.get('plan', '?')}; {facts.get('hardware', '?')}",
        f"- Sessions: {facts.get('sessions', '?')}, {facts.get('gpu_hours', 0):.2f} GPU hours", "",
        "## Evaluation", "",
        *_evaluation(cfg, b, f),
        change_line(results) + ".", "",
        "Files: `eval_results.json` (both results, the configuration), `samples.md` (5 answers before and after).", "",
        "## Limitations", "",
        "Measured on a small held-out subset of the training data's own distribution; " + _LIMITS[cfg.trainer] +
        "Neither says how the model does on other data or on safety.", "",
        "## Use it", "",
        "```python",
        *(["from peft import PeftModel"] if cfg.method != "full" else []),
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
    ]
    if cfg.method != "full":
        lines += [f'base = AutoModelForCausalLM.from_pretrained("{cfg.model}", revision='
                  f'{_revision_literal(run)}, dtype="auto")',
                  f"model = PeftModel.from_pretrained(base, {where})"]
    else:
        lines += [f"model = AutoModelForCausalLM.from_pretrained({where})"]
    lines += [f"tokenizer = AutoTokenizer.from_pretrained({where})", "```", ""]
    if cfg.method != "full":  # a full model is already plain weights: nothing to merge
        lines += ["Merged into plain 16-bit weights (loads with `AutoModelForCausalLM` alone; GGUF via llama.cpp):",
                  "", "```", facts.get("export_command") or "python -m kit export --adapter final -o merged", "```", ""]
    lines += ["## Re-run the job", "", "```", facts.get("command", "python train_ddp.py"), "```", "",
              "Where things are" + (f" in `{repo}` (branch main)" if repo else "") + ": `final/` this deliverable; "
              "`checkpoints/` the resumable training checkpoints; `kit/` the job's records "
              "(run.json, baseline.json, sessions.jsonl).", ""]
    return "\n".join(lines)


TRAINER_NAMES = {"sft": "SFTTrainer", "dpo": "DPOTrainer", "kto": "KTOTrainer", "grpo": "GRPOTrainer"}
_PREFERENCE_LIMITS = ("preference accuracy counts the held-out answers the trained model's implicit reward ranks as "
                      "the data does, against the starting model. ")
_LIMITS = {"sft": "exact match is a strict string comparison. ", "dpo": _PREFERENCE_LIMITS,
           "kto": _PREFERENCE_LIMITS,
           "grpo": "each reward mean is of one sampled completion per held-out prompt, scored by the job's own reward "
                   "functions, so it is only as good a measure as they are. "}


def _evaluation(cfg, b: dict | None, f: dict | None) -> list[str]:
    """The evaluation section's table: one row of words; for reward functions a row for each."""
    if cfg.trainer != "grpo":
        return [f"Held-out rows, the same ones before and after (greedy decoding, seed {cfg.seed}):", "",
                "| | before (step 0) | after |", "| --- | --- | --- |", f"| result | {words(b)} | {words(f)} |", ""]
    rb, rf = (b or {}).get("result") or {}, (f or {}).get("result") or {}
    lines = [f"Held-out prompts, the same ones before and after, one completion each sampled at temperature "
             f"{cfg.grpo.temperature:g} (seed {cfg.seed}, the same noise before and after), up to "
             f"{cfg.grpo.max_completion_length} tokens; the mean of each reward function:", "",
             "| | before (step 0) | after |", "| --- | --- | --- |"]
    for name in _reward_names(cfg, rb, rf):
        lines.append(f"| `{name}` | {_mean(b, rb, name)} | {_mean(f, rf, name)} |")
    lines.append(f"| sum (TRL's `reward`) | {_mean(b, rb, None)} | {_mean(f, rf, None)} |")
    return lines + [""]


def _reward_names(cfg, *measured: dict) -> list[str]:
    """The reward functions by name: as measured, else as the config names them."""
    for r in measured:
        if r.get("rewards"):
            return list(r["rewards"])
    return parse_spec(cfg.grpo.rewards)[1] if cfg.grpo.rewards else []


def _mean(record: dict | None, result: dict, name: str | None) -> str:
    if not result:
        return words(record).replace("|", "\\|")
    value = result.get("reward") if name is None else (result.get("rewards") or {}).get(name)
    return "none scored" if value is None else f"{value:.4g}"


def _trainer_words(cfg) -> str:
    if cfg.trainer == "grpo":
        names = ", ".join(parse_spec(cfg.grpo.rewards)[1]) if cfg.grpo.rewards else "?"
        return (f"GRPO with the reward functions {names}, {cfg.grpo.num_generations} completions per prompt of up to "
                f"{cfg.grpo.max_completion_length} tokens at temperature {cfg.grpo.temperature:g}, beta "
                f"{cfg.grpo.beta:g}, loss {cfg.grpo.loss_type}")
    if cfg.trainer == "dpo":
        return f"DPO on preference pairs, beta {cfg.dpo.beta:g}, loss {cfg.dpo.loss_type}"
    return (f"KTO on answers labelled desirable or not, beta {cfg.kto.beta:g}, weights "
            f"{cfg.kto.desirable_weight:g}/{cfg.kto.undesirable_weight:g}")


def _revision_literal(run: dict) -> str:
    rev = run.get("base_revision") or ""
    return f'"{rev[4:]}"' if rev.startswith("hub:") else "None"
