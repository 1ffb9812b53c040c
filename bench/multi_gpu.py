"""Everything issue #18 asks of two or more GPUs, in one command on one machine.

    python bench/multi_gpu.py --models /tmp/kit-models --out bench/results/multi_gpu_h200x2.json
    python bench/multi_gpu.py --cpu-dry-run --out /tmp/multi_gpu_cpu.json   # the driver itself, gloo, tiny model

Runs the script `kit render` writes, under real torchrun, one after another:
  1. scaling: Qwen3-8B shape QLoRA at the 2×T4 plan's per-device batch and seq_len (fp16, each rank's
     allocator capped at a T4's 14.06 GiB): tokens/s on N GPUs against 1 at the same per-device batch,
     for each backend present; on N GPUs also with checkpoints uploading to tests/hubserver.py.
  2. lifecycle: --lifecycle-runs short runs on N ranks (save, eval, final push, exit): none may hang, none
     may print "destroy_process_group() was not called"; SIGTERM while a checkpoint is being written;
     a deadline stop (time_budget_minutes).
  3. crash: kill -9 one rank mid-step, and rank 0 mid-save: the whole job must exit non-zero within 60 s,
     the store's newest checkpoint must verify, and the rerun must resume.
  4. resume: kill -9 of the whole job at a random step, rerun from the Hub: the final adapter against an
     uninterrupted run's (max |Δ|; fp16 on NCCL is not bitwise, so the tolerance is stated in the result).
  5. fsdp: a config that does not fit one capped GPU, when `kit plan` plans FSDP for it: per-GPU peak
     against the plan's estimate (target within 10 %), and a resume.
The runs on a 0.6B shape (lifecycle, crash, resume) test NCCL's behaviour, not speed, and keep the
whole command inside one device call. Each result says what it measured and what it skipped and why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_XET", "1")  # the test server speaks LFS, not Xet
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_common import (GIB, ROOT, bench_env, common_overrides, make_long_text,  # noqa: E402
                              make_random_model, render, session_record)
from tests.hubserver import WRITE_TOKEN, HubServer  # noqa: E402

T4_CAP_GIB = 14.06
HANG_S = 60.0
NOT_DESTROYED = "destroy_process_group() was not called"
STEP_LINE = re.compile(r"'loss':")


# --- processes -------------------------------------------------------------------------------------

def cap_site(work: Path, cap_gib: float | None) -> Path | None:
    """A sitecustomize that caps each *rank's* allocator (LOCAL_RANK set; the torchrun agent is left alone)."""
    if not cap_gib:
        return None
    site = work / "capsite"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import os\n"
        "if 'LOCAL_RANK' in os.environ:\n"
        "    import torch\n"
        "    if torch.cuda.is_available():\n"
        "        d = int(os.environ['LOCAL_RANK'])\n"
        f"        total = torch.cuda.get_device_properties(d).total_memory\n"
        f"        torch.cuda.set_per_process_memory_fraction(min(1.0, {cap_gib} * 2**30 / total), d)\n")
    return site


class Job:
    """One torchrun job of the rendered script; its output goes to a log file, read as it grows."""

    def __init__(self, script: Path, nproc: int, overrides: list[str], env: dict, log: Path):
        self.log = log
        self.tag = f"{os.getpid()}-{log.stem}"
        env = {**env, "KIT_BENCH_JOB": self.tag}  # travels through torchrun to the ranks: Job.ranks() finds them
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                str(script), *overrides]
        self.started = time.monotonic()
        # A session of its own, so the whole job (agent + ranks, which torchrun starts in their own
        # sessions too) can be found and killed.
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def steps_logged(self) -> int:
        return len(STEP_LINE.findall(self.text()))

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def ranks(self) -> dict[int, int]:
        """{RANK: pid} of this job's worker processes, read from /proc."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"torch.distributed.run" in cmd or b"torchrun" in cmd:
                continue
            vals = dict(e.split(b"=", 1) for e in env if b"=" in e)
            if vals.get(b"TORCHELASTIC_RUN_ID") and vals.get(b"KIT_BENCH_JOB") == self.tag.encode():
                found[int(vals.get(b"RANK", b"-1"))] = int(entry.name)
        return found

    def kill_all(self) -> None:
        for pid in list(self.ranks().values()) + [self.proc.pid]:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.wait(30)


def wait_until(pred, timeout: float, every: float = 0.2) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return False


def newest_checkpoint_dir(out: Path) -> Path | None:
    ckpts = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1)
    return ckpts[-1] if ckpts else None


def kit_status(overrides: list[str], env: dict) -> dict:
    r = subprocess.run([sys.executable, "-m", "kit", "status", "--config", "configs/default.yaml", *overrides,
                        "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip().splitlines()[-1:]}
    return json.loads(r.stdout)


def adapter_delta(a: Path, b: Path) -> float | None:
    from safetensors.torch import load_file
    fa, fb = a / "adapter_model.safetensors", b / "adapter_model.safetensors"
    if not (fa.exists() and fb.exists()):
        return None
    ta, tb = load_file(str(fa)), load_file(str(fb))
    if ta.keys() != tb.keys():
        return float("inf")
    return max(float((ta[k].float() - tb[k].float()).abs().max()) for k in ta)


# --- the runs ----------------------------------------------------------------------------------------

class Bench:
    def __init__(self, a, work: Path, server: HubServer):
        self.a, self.work, self.server = a, work, server
        self.n = a.nproc
        self.site = cap_site(work, None if a.cpu_dry_run else a.cap_gib)
        self.data = make_long_text(Path(a.models) / "long.jsonl")
        self.jobs = 0

    def env(self) -> dict:
        extra = {"HF_ENDPOINT": self.server.url, "HF_TOKEN": WRITE_TOKEN, "HF_HUB_OFFLINE": "0",
                 "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
        env = bench_env(**extra)
        if self.site:
            env["PYTHONPATH"] = os.pathsep.join([str(self.site), env["PYTHONPATH"]])
        return env

    def model(self, hub_id: str) -> tuple[Path, str, int, list[str], str]:
        """(model dir, method, seq, extra overrides, --gpus) for a shape; the tiny model on a CPU dry run."""
        if self.a.cpu_dry_run:
            return ROOT / "models" / "tiny-qwen3", "lora", 128, ["precision=fp32"], "cpu"
        name = hub_id.split("/")[-1].lower()
        return make_random_model(hub_id, Path(self.a.models) / name), "qlora", self.a.seq, [
            f"precision={self.a.precision}"], f"{self.n}x{self.a.gpu_name}"

    def job(self, script: Path, nproc: int, overrides: list[str], tag: str) -> Job:
        self.jobs += 1
        env = self.env()
        log = self.work / f"{self.jobs:02d}-{tag}.log"
        return Job(script, nproc, overrides, env, log)

    def prepare(self, hub_id: str, out: Path, steps: int, batch: int, extra: list[str] = (),
                tag: str = "run") -> tuple[Path, list[str]]:
        model, method, seq, more, gpus = self.model(hub_id)
        ov = common_overrides(model, self.data, out, method=method, seq=seq, batch=batch, gc=True, steps=steps)
        ov = [o for o in ov if not o.startswith(("precision=", "global_batch="))] + more + [
            f"global_batch={batch * self.n}"] + list(extra)  # later key=value win: extra may set its own
        script = self.work / f"{tag}.py"
        render(ov, script, gpus=gpus)
        return script, ov

    def run_to_end(self, script, nproc, ov, tag, timeout) -> dict:
        j = self.job(script, nproc, ov, tag)
        rc = j.wait(timeout)
        if rc is None:
            j.kill_all()
        text = j.text()
        return {"rc": rc, "hung": rc is None, "wall_s": round(time.monotonic() - j.started, 1),
                "not_destroyed_warning": NOT_DESTROYED in text, "log": j.log.name}

    # 1
    def scaling(self) -> dict:
        out = {}
        backends = ["transformers"] + (["unsloth"] if self.a.unsloth else [])
        for backend in backends:
            rows = {}
            for label, nproc, store in (("1gpu", 1, None), (f"{self.n}gpu", self.n, None),
                                        (f"{self.n}gpu_uploads", self.n, f"hf://bench/scale-{backend}")):
                o = self.work / f"scale-{backend}-{label}"
                extra = [f"backend={backend}", f"global_batch={self.a.batch * nproc}"]
                if store:
                    extra += [f"store={store}", f"save_steps={max(2, self.a.steps // 4)}"]
                script, ov = self.prepare("Qwen/Qwen3-8B", o, self.a.steps, self.a.batch, extra, f"scale-{backend}-{label}")
                r = self.run_to_end(script, nproc, ov, f"scale-{backend}-{label}", self.a.timeout)
                if r["rc"] == 0:
                    rec = session_record(o)
                    r.update(tokens_per_s=rec.get("tokens_per_s"), step_s=rec.get("step_s"),
                             peak_allocated_gib=round((rec.get("peak_allocated_bytes") or 0) / GIB, 2))
                rows[label] = r
            one, many = rows["1gpu"].get("tokens_per_s"), rows[f"{self.n}gpu"].get("tokens_per_s")
            rows["speedup"] = round(many / one, 3) if one and many else None
            up = rows[f"{self.n}gpu_uploads"].get("tokens_per_s")
            rows["uploads_cost_pct"] = round(100 * (1 - up / many), 2) if up and many else None
            out[backend] = rows
        out["target_speedup"] = 1.9
        return out

    # 2
    def lifecycle(self) -> dict:
        o = self.work / "life"
        extra = ["store=hf://bench/life", "save_steps=2", "eval_steps=2", "data.eval_fraction=0.1"]
        script, ov = self.prepare("Qwen/Qwen3-0.6B", o, 4, 2, extra, "life")
        runs = []
        for i in range(self.a.lifecycle_runs):
            shutil.rmtree(o, ignore_errors=True)
            runs.append(self.run_to_end(script, self.n, ov + [f"store=hf://bench/life-{i}"], f"life-{i}", HANG_S * 5))
        result = {"runs": len(runs), "ok": sum(r["rc"] == 0 for r in runs), "hung": sum(r["hung"] for r in runs),
                  "not_destroyed_warnings": sum(r["not_destroyed_warning"] for r in runs),
                  "wall_s": [r["wall_s"] for r in runs]}
        # SIGTERM while a checkpoint is being written: the agent forwards it; the job must pause cleanly.
        shutil.rmtree(o, ignore_errors=True)
        j = self.job(script, self.n, [x for x in ov if not x.startswith("max_steps=")] + [
            "max_steps=400", "save_steps=3", "store=hf://bench/life-term"], "life-sigterm")
        saw = wait_until(lambda: newest_checkpoint_dir(o) is not None, self.a.timeout)
        t0 = time.monotonic()
        os.kill(j.proc.pid, signal.SIGTERM)
        rc = j.wait(HANG_S)
        if rc is None:
            j.kill_all()
        text = j.text()
        result["sigterm_during_save"] = {"saw_save": saw, "rc": rc, "exit_s": round(time.monotonic() - t0, 1),
                                         "paused_line": "[kit] paused at step" in text,
                                         "not_destroyed_warning": NOT_DESTROYED in text}
        # The deadline stop.
        shutil.rmtree(o, ignore_errors=True)
        r = self.run_to_end(script, self.n, [x for x in ov if not x.startswith("max_steps=")] + [
            "max_steps=100000", "time_budget_minutes=1.5", "store=hf://bench/life-deadline"], "life-deadline",
            self.a.timeout)
        r["paused_line"] = "[kit] paused at step" in (self.work / r["log"]).read_text(errors="replace")
        result["deadline_stop"] = r
        return result

    # 3
    def crash(self) -> dict:
        result = {}
        for case in ("rank1_mid_step", "rank0_mid_save"):
            o = self.work / f"crash-{case}"
            store = f"hf://bench/crash-{case}"
            script, ov = self.prepare("Qwen/Qwen3-0.6B", o, 400, 2, [f"store={store}", "save_steps=3"], f"crash-{case}")
            j = self.job(script, self.n, ov, f"crash-{case}")
            if case == "rank1_mid_step":
                armed = wait_until(lambda j=j: j.steps_logged() >= 4, self.a.timeout)
                victim = 1
            else:
                armed = wait_until(lambda j=j, o=o: (newest_checkpoint_dir(o) or Path("/nonexistent")).name != "checkpoint-3"
                                   and newest_checkpoint_dir(o) is not None and j.steps_logged() >= 5, self.a.timeout)
                victim = 0
            pids = j.ranks()
            t0 = time.monotonic()
            if victim in pids:
                os.kill(pids[victim], signal.SIGKILL)
            rc = j.wait(HANG_S + 30)
            exit_s = round(time.monotonic() - t0, 1)
            if rc is None:
                j.kill_all()
            st = kit_status(ov, self.env())
            rerun = self.run_to_end(script, self.n, [x for x in ov if not x.startswith("max_steps=")] + [
                f"max_steps={(st.get('latest_step') or 0) + 3}"], f"crash-{case}-rerun", self.a.timeout)
            resumed = "resuming from step" in (self.work / rerun["log"]).read_text(errors="replace")
            result[case] = {"armed": armed, "killed_rank": victim if victim in pids else None, "rc": rc,
                            "exit_s": exit_s, "within_60s": rc is not None and rc != 0 and exit_s <= HANG_S,
                            "store_latest_verified": st.get("latest_step"), "status_error": st.get("error"),
                            "rerun_rc": rerun["rc"], "rerun_resumed": resumed}
        return result

    # 4
    def resume(self) -> dict:
        steps = 12
        ref_out, cut_out = self.work / "res-ref", self.work / "res-cut"
        script, ov = self.prepare("Qwen/Qwen3-0.6B", ref_out, steps, 2, ["store=hf://bench/res-ref", "save_steps=3"], "res")
        ref = self.run_to_end(script, self.n, ov, "res-ref", self.a.timeout)
        cut_ov = [x.replace(str(ref_out), str(cut_out)).replace("bench/res-ref", "bench/res-cut") for x in ov]
        j = self.job(script, self.n, cut_ov, "res-cut")
        kill_at = random.Random(self.a.seed).randint(4, steps - 2)
        wait_until(lambda: j.steps_logged() >= kill_at, self.a.timeout)
        j.kill_all()
        shutil.rmtree(cut_out, ignore_errors=True)  # a new session: nothing local, all from the Hub
        again = self.run_to_end(script, self.n, cut_ov, "res-rerun", self.a.timeout)
        delta = adapter_delta(newest_checkpoint_dir(ref_out) or ref_out, newest_checkpoint_dir(cut_out) or cut_out)
        return {"killed_after_step": kill_at, "reference_rc": ref["rc"], "rerun_rc": again["rc"],
                "rerun_resumed_from_store": "(store" in (self.work / again["log"]).read_text(errors="replace"),
                "adapter_max_abs_diff": delta, "tolerance": 0.0 if self.a.cpu_dry_run else 1e-2}

    # 5
    def fsdp(self) -> dict:
        if self.a.cpu_dry_run:
            hub_id, gpus = None, None
        else:
            hub_id, gpus = self.a.fsdp_model, f"{self.n}xT4"
        cfg = ["--config", "configs/default.yaml", f"model={hub_id}", "method=qlora", f"seq_len={self.a.seq}",
               f"per_device_batch={self.a.batch}"] if hub_id else None
        if not cfg:
            return {"skipped": "CPU dry run: FSDP-QLoRA needs GPUs"}
        plan = subprocess.run([sys.executable, "-m", "kit", "plan", *cfg, "--gpus", gpus, "--json"], cwd=ROOT,
                              env=self.env(), capture_output=True, text=True)
        if plan.returncode != 0:
            return {"skipped": f"kit plan refused: {(plan.stderr or plan.stdout).strip()[-300:]}"}
        p = json.loads(plan.stdout)
        if p.get("strategy") != "fsdp":
            return {"skipped": f"kit plans {p.get('strategy')} for {hub_id} on {gpus}, not fsdp"}
        o = self.work / "fsdp"
        script, ov = self.prepare(hub_id, o, 8, self.a.batch, ["save_steps=4"], "fsdp")
        r = self.run_to_end(script, self.n, ov, "fsdp", self.a.timeout)
        if r["rc"] == 0:
            rec = session_record(o)
            peak = rec.get("peak_allocated_bytes") or 0
            est = p["memory"]["allocated_bytes"]
            r.update(peak_allocated_gib=round(peak / GIB, 2), estimate_gib=round(est / GIB, 2),
                     error_pct=round(100 * (est - peak) / peak, 2) if peak else None)
            again = self.run_to_end(script, self.n, [x for x in ov if not x.startswith("max_steps=")] + ["max_steps=10"],
                                    "fsdp-resume", self.a.timeout)
            r["resume_rc"] = again["rc"]
        r["target_error_pct"] = 10
        return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="/tmp/kit-models")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--gpu-name", default="H200")
    p.add_argument("--seq", type=int, default=512, help="the 2×T4 8B plan's seq_len")
    p.add_argument("--batch", type=int, default=8, help="the 2×T4 8B plan's per-device batch")
    p.add_argument("--precision", default="fp16", help="what the T4 plan uses")
    p.add_argument("--cap-gib", type=float, default=T4_CAP_GIB)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--lifecycle-runs", type=int, default=20)
    p.add_argument("--unsloth", action="store_true", help="also the Unsloth backend (needs unsloth importable)")
    p.add_argument("--fsdp-model", default="Qwen/Qwen3-32B")
    p.add_argument("--only", default="scaling,lifecycle,crash,resume,fsdp")
    p.add_argument("--timeout", type=float, default=420)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-dry-run", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "multi_gpu_h200x2.json"))
    a = p.parse_args()
    if a.cpu_dry_run:
        a.lifecycle_runs = min(a.lifecycle_runs, 2)
        a.steps = 6
    work = Path(tempfile.mkdtemp(prefix="kit-multi-"))
    result = {"what": __doc__.splitlines()[0], "machine": platform.node(), "nproc": a.nproc,
              "cpu_dry_run": a.cpu_dry_run, "cap_gib": None if a.cpu_dry_run else a.cap_gib}
    with HubServer(tokens={WRITE_TOKEN: "write"}) as server:
        server.lfs_threshold = 1_000_000
        bench = Bench(a, work, server)
        for name in a.only.split(","):
            started = time.monotonic()
            try:
                result[name] = getattr(bench, name)()
            except (SystemExit, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
                result[name] = {"failed": f"{type(e).__name__}: {str(e)[-600:]}"}  # recorded, the next run goes on
            result[name]["bench_s"] = round(time.monotonic() - started, 1)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
            print(f"[bench] {name}: {json.dumps(result[name])[:400]}", flush=True)
    print(f"[bench] logs in {work}; result in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
