"""`kit export`: the finished adapter merged into 16-bit weights, checked, optionally pushed and GGUF'd.

    kit export --config configs/default.yaml                  # output_dir/final -> output_dir/merged
    kit export --adapter outputs/default/final -o /tmp/merged --push hf://me/ha-merged
    kit export --adapter outputs/default/final -o /tmp/merged --gguf q8_0 --llama-cpp ~/llama.cpp
"""

from __future__ import annotations

import json
from pathlib import Path

from kit.errors import shown
from kit.planning import config


def add_arguments(parser) -> None:
    config.add_config_arguments(parser, config.default_config())
    parser.add_argument("--adapter", metavar="DIR", help="adapter folder (default: the config's output_dir/final)")
    parser.add_argument("-o", "--output", metavar="DIR", help="new folder for the merged model "
                        "(default: the config's output_dir/merged)")
    parser.add_argument("--base", metavar="PATH_OR_ID", help="the base model, when not the adapter's own "
                        "(e.g. a local copy); its revision must still match unless --force")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="weights to save")
    parser.add_argument("--push", metavar="hf://OWNER/NAME", help="also upload the merged folder, in one commit")
    parser.add_argument("--gguf", metavar="TYPE", help="also write a GGUF with llama.cpp (q8_0, f16, Q4_K_M, …)")
    parser.add_argument("--llama-cpp", metavar="DIR", help="llama.cpp checkout (default: $LLAMA_CPP_DIR)")
    parser.add_argument("--force", action="store_true", help="merge even if the base revision differs")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    from kit.deliver import export, gguf
    from kit.errors import KitError

    store = None
    if args.push:  # before any work: a typo, no token or no network must not cost a merge
        from kit.checkpoints.store.hub import HubStore

        check_push(args.push)
        store = HubStore(args.push)
        store.check_writable()  # a token is there (whether it may write shows at the commit)
        store.preflight()  # offline mode, a silent endpoint: one bounded request
    cfg = config.from_args(args)
    adapter = Path(args.adapter or Path(cfg.output_dir) / "final")
    if args.adapter is None and not adapter.exists():  # the default was not asked for: say where it came from
        from kit.errors import UsageError

        source = args.config or "the built-in defaults"
        raise UsageError(f"no finished job to export: {adapter} (output_dir/final of {source}) does not exist: "
                         "run the job to its end first, or give --adapter DIR (a final/ or checkpoint-N folder)")
    out = Path(args.output or Path(cfg.output_dir) / "merged")
    qtype = gguf.check_type(args.gguf) if args.gguf else None
    llama = gguf.find_llama_cpp(args.llama_cpp) if qtype else None  # refused before any work
    if qtype:
        gguf.check_tools(qtype, llama)
    plan = export.prepare(adapter, out, base=args.base, dtype=args.dtype, force=args.force,
                          gguf_type=qtype)
    for w in plan.warnings:
        print(f"warning: {w}")
    print(f"export: {shown(plan.adapter)} onto {shown(plan.base)} ({plan.base_revision}) in {plan.dtype} -> "
          f"{shown(plan.out)} "
          f"(needs ~{plan.need_bytes / 1e9:.2f} GB, {plan.free_bytes / 1e9:.1f} GB free)", flush=True)
    result = {"plan": plan.to_dict(), **export.merge(plan)}
    agree = result["top1_agreement"]
    print(f"verified: merged logits match base + adapter on {result['prompts']} prompts: RMS error "
          f"{result['rms_logit_error']:.3g} against fp32, {result['error_vs_noise'] or 0:.2f}× that of {plan.dtype} "
          f"inference unmerged (≤ {result['tolerance']:.3g}), greedy agreement "
          f"{'n/a' if agree is None else f'{100 * agree:.1f} %'} at {result['top1_positions_counted']} clear positions")
    if qtype:
        try:
            result["gguf"] = str(gguf.convert(out, qtype, llama))
        except KitError as err:  # the merged folder is complete and verified: say so, keep it
            raise KitError(f"{err} (the verified 16-bit export in {out} is complete and kept; GGUF can be "
                           f"retried from it)", err.exit_code) from None
        print(f"gguf: {shown(result['gguf'])}")
    if store is not None:
        result["pushed"] = store.publish_folder(out, "", "kit: merged model")
        print(f"pushed: {result['pushed']}")
    print(f"load it: AutoModelForCausalLM.from_pretrained({str(out)!r})")
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


def check_push(spec: str) -> None:
    """`--push` must name a Hub repo, hf://owner/name, in the Hub's own spelling rules."""
    from kit.planning.names import parse_repo_id
    from kit.errors import UsageError

    if not spec.startswith("hf://"):
        raise UsageError(f"--push {spec}: give a Hub repo as hf://owner/name")
    try:
        parse_repo_id(spec)
    except UsageError:
        raise UsageError(f"--push {spec}: not a valid Hub repo id: give hf://owner/name (letters, digits, "
                         "'-', '_', '.')") from None
