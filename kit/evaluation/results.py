"""Where evaluation results live, and the files they become.

The baseline is measured once per job: it is written to `output_dir/kit_baseline.json` and, with a
store, to the store's `kit/baseline.json`, where a later session (another machine, after a cut)
finds it and does not measure again. `eval_results.json` puts baseline and final side by side;
`samples.md` shows the sampled answers before and after.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from kit import files
from kit.redaction import redact
from kit.shown import shown
from kit.errors import KitError

BASELINE_STORE = "baseline.json"
BASELINE_LOCAL = "kit_baseline.json"
SCHEMA = 1
_HASH_LIMIT = 512 << 20


def data_fingerprint(data_cfg) -> str:
    """sha256 of a local data file (or its size above 512 MiB), else the Hub dataset id and split."""
    path = Path(data_cfg.path)
    if path.is_file():
        if path.stat().st_size > _HASH_LIMIT:
            return f"size:{path.stat().st_size}"
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return f"sha256:{h.hexdigest()}"
    return f"dataset:{data_cfg.path}@{data_cfg.split}"


def read_baseline(output_dir, store) -> tuple[dict | None, str]:
    """(the job's baseline record or None, where it was found). The store wins: it outlives the machine."""
    if store is not None:
        found = _parse(store.read_text(BASELINE_STORE))
        if found is not None:
            return found, store.describe()
    local = Path(output_dir) / BASELINE_LOCAL
    found = _parse(local.read_text()) if local.exists() else None
    return found, (str(local) if found else "")


def write_baseline(record: dict, output_dir, store) -> list[str]:
    """Write the baseline locally and to the store; returns warnings (a store failure is not fatal)."""
    text = redact(json.dumps(record, indent=1))  # its samples quote the data, which may hold a token
    files.write_atomic(Path(output_dir) / BASELINE_LOCAL, text, mkdir=True)
    if store is None:
        return []
    try:
        store.write_text(BASELINE_STORE, text)
    except KitError as e:
        return [f"the baseline could not be kept in the store ({e}); a resume elsewhere measures it again"]
    return []


def _parse(text: str | None) -> dict | None:
    try:
        data = files.parse_json(text) if text else None
    except ValueError:  # not JSON, a number past 4300 digits, or nested past the limit
        return None
    return data if isinstance(data, dict) and "run_id" in data else None


def primary(baseline: dict | None, final: dict | None) -> dict:
    """The headline number: for prompt data (grpo) the mean summed reward; else the task metric where both
    have it, else eval loss (lower is better)."""
    b, f = (baseline or {}).get("result") or {}, (final or {}).get("result") or {}
    if "prompts" in ((baseline or {}).get("data_format"), (final or {}).get("data_format")):
        # prompt rows (kit.evaluation.rewards): the summed reward, as TRL logs it, measured or not
        return {"name": "reward", "baseline": b.get("reward"), "final": f.get("reward"), "higher_is_better": True}
    if (b.get("metric") or {}).get("name") and (f.get("metric") or {}).get("name"):
        return {"name": b["metric"]["name"], "baseline": b["metric"]["value"], "final": f["metric"]["value"],
                "higher_is_better": True}
    return {"name": "eval_loss", "baseline": b.get("loss"), "final": f.get("loss"), "higher_is_better": False}


def eval_results(cfg, identity: dict, baseline: dict | None, final: dict | None, step: int) -> dict:
    from kit.planning.config import to_dict

    return {
        "schema": SCHEMA, "run_id": identity.get("run_id"), "model": cfg.model, "revision": cfg.revision,
        "base_revision": identity.get("base_revision"), "method": cfg.method, "step": step,
        "data": {"path": cfg.data.path, "format": (baseline or final or {}).get("data_format"),
                 "fingerprint": data_fingerprint(cfg.data), "eval_fraction": cfg.data.eval_fraction},
        "eval_config": to_dict(cfg)["eval"], "seed": cfg.seed,
        "baseline": baseline, "final": final, "primary_metric": primary(baseline, final),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def words(record: dict | None) -> str:
    """`loss 3.21, perplexity 24.8, exact match 3/42` or `skipped: why`."""
    if not record:
        return "not measured"
    if record.get("skipped"):
        return f"skipped: {record['skipped']}"
    r = record["result"]
    m = r.get("metric") or {}
    if "rewards" in r:  # prompt rows (kit.evaluation.rewards)
        return (f"mean reward {_number(r['reward'])} ("
                + ", ".join(f"{shown(name)} {_number(v)}" for name, v in r["rewards"].items())
                + f") on {r['rows']} prompts")
    if "reward_margin" in r:  # preference rows (kit.evaluation.preference)
        return (f"preference accuracy {m['correct']}/{m['of']} ({100 * m['value']:.0f} %), reward margin "
                f"{r['reward_margin']:.4g}, loss {r['loss']:.4g}")
    if r.get("loss") is None:
        return f"not scored: {m.get('skipped')}"
    out = f"loss {r['loss']:.4g}, perplexity {r['perplexity']:.4g}"
    if m.get("name"):
        out += f", exact match {m['correct']}/{m['of']} ({100 * m['value']:.0f} %)"
    return out


def change_line(results: dict) -> str:
    """`eval loss 3.21 → 1.05; exact match 0 % → 45 % (on 42 held-out rows)`."""
    b, f = results.get("baseline") or {}, results.get("final") or {}
    if b.get("skipped") or f.get("skipped") or not b or not f:
        return f"eval: baseline {words(b)}; final {words(f)}"
    rb, rf = b["result"], f["result"]
    if "rewards" in rb and "rewards" in rf:
        each = "; ".join(f"{shown(name)} {_number(rb['rewards'].get(name))} → {_number(v)}"
                         for name, v in rf["rewards"].items())
        return (f"mean reward {_number(rb['reward'])} → {_number(rf['reward'])}; {each} (on {rf['rows']} held-out "
                f"prompts, one completion each)")
    if "reward_margin" in rb and "reward_margin" in rf:
        return (f"preference accuracy {100 * rb['metric']['value']:.0f} % → {100 * rf['metric']['value']:.0f} %, "
                f"reward margin {rb['reward_margin']:.4g} → {rf['reward_margin']:.4g}, loss {rb['loss']:.4g} → "
                f"{rf['loss']:.4g} (on {rf['rows']} held-out rows)")
    if rb.get("perplexity") is None or rf.get("perplexity") is None:
        return f"eval: baseline {words(b)}; final {words(f)}"
    line = f"eval loss {rb['loss']:.4g} → {rf['loss']:.4g}, perplexity {rb['perplexity']:.4g} → {rf['perplexity']:.4g}"
    mb, mf = rb.get("metric") or {}, rf.get("metric") or {}
    if mb.get("name") and mf.get("name"):
        line += f"; exact match {100 * mb['value']:.0f} % → {100 * mf['value']:.0f} %"
    elif mf.get("skipped"):
        line += f"; no task metric ({mf['skipped']})"
    return line + f" (on {rf['rows']} held-out rows)"


def _number(value) -> str:
    return "none scored" if value is None else f"{value:.4g}"


def samples_markdown(results: dict) -> str:
    """The sampled answers before and after, one block per prompt."""
    rb = (results.get("baseline") or {}).get("result") or {}
    rf = (results.get("final") or {}).get("result") or {}
    before, after = rb.get("samples") or [], rf.get("samples") or []
    decoding = rf.get("decoding") or rb.get("decoding")
    how = (f"Completions sampled at temperature {decoding['temperature']:g} (seed {decoding['seed']}, the same "
           "noise before and after), each scored by every reward function" if decoding else "Greedy answers")
    lines = [f"# Samples: run {results.get('run_id')}, {results.get('model')}", "",
             f"{how}, to held-out prompts (a fixed, seeded choice), before and after training.", ""]
    if not before and not after:
        return "\n".join(lines + ["No samples: the evaluation was skipped (see eval_results.json).", ""])
    for i in range(max(len(before), len(after))):
        b = before[i] if i < len(before) else {}
        a = after[i] if i < len(after) else {}
        prompt = (a or b).get("prompt", "")
        lines += [f"## Sample {i + 1}", "", "Prompt:", "", _fence(prompt), ""]
        if "reference" in (a or b):
            lines += ["Reference:", "", _fence((a or b).get("reference", "")), ""]
        lines += ["Before (step 0):" + _rewards_words(b), "", _fence(b.get("output", "(not measured)")), "",
                  f"After (step {results.get('step')}):" + _rewards_words(a), "",
                  _fence(a.get("output", "(not measured)")), ""]
    return "\n".join(lines)


def _rewards_words(sample: dict) -> str:
    """` rewards: correct 1, format 0.5` for a sample scored by reward functions, else nothing."""
    if not sample.get("rewards"):
        return ""
    return " rewards: " + ", ".join(f"{shown(n)} {'None' if v is None else f'{v:.4g}'}"
                                    for n, v in sample["rewards"].items())


def _fence(text: str) -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}\n{text}\n{fence}"
