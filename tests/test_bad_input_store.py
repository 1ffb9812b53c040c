"""Bad input for the store, checkpoints, resume and the network: one `error:` line, the right exit
code, no traceback, nothing lost or overwritten, the fake token nowhere (issue #11).

Every case builds its inputs in its own tmp_path and runs in-process: `kit status` through
`kit.cli.main`, the training script as `python train_ddp.py` would (runpy with `__main__`, so
its own error handler runs). Hub cases use the real huggingface_hub client against
tests/hubserver.py; the silent endpoint is a real TCP server that never answers.
"""

from __future__ import annotations

import json
import runpy
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from huggingface_hub import constants as hf_constants

from kit import cli
from kit.planning import config
from kit.checkpoints import fingerprint
from kit.checkpoints.manifest import MANIFEST_NAME, write_manifest
from kit.checkpoints.store import base
from tests.hubserver import READ_TOKEN, WRITE_TOKEN, HubServer
from tests.scripts import ROOT, SCRIPT, train, train_here
from tests.test_store import make_ckpt

FAKE = WRITE_TOKEN
REPO = "me/ckpts"


@dataclass
class Ctx:
    tmp: Path
    hub: HubServer
    monkeypatch: pytest.MonkeyPatch

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def cfg(self, *overrides: str):
        """The training script's settings (configs/default.yaml, which it embeds) for this case."""
        return config.load(str(ROOT / "configs/default.yaml"), [f"output_dir={self.out}", *overrides])

    def sealed(self, step: int = 4, *overrides: str, root: Path | None = None) -> Path:
        """A checkpoint with a manifest carrying the fingerprint the script would write."""
        d = make_ckpt(root or self.out, step, manifest=False)
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 60}))
        write_manifest(d, step, 1, fingerprint.of_job(self.cfg(*overrides)))
        return d

    def hub_store(self, steps=(3, 6)) -> str:
        for s in steps:
            d = self.sealed(s, root=self.tmp / "src")
            files = {f"checkpoints/checkpoint-{s}/{p.name}": p.read_bytes() for p in d.iterdir()}
            self.hub.put_files(REPO, files)
        return f"store=hf://{REPO}"


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def silent_endpoint(ctx: Ctx) -> str:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(srv.accept()[0]) for _ in range(8)], daemon=True).start()
    ctx.monkeypatch.setattr(sys.modules[__name__], "_keep_alive", (srv, held), raising=False)
    return f"http://127.0.0.1:{srv.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


# Each case: (inputs built in ctx) -> (entry "status" | "script", argv, exit code, words in the error).
CASES: dict[str, Callable[[Ctx], tuple[str, list[str], int, str]]] = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


# ---- store: kit status ---------------------------------------------------------------------------
@case
def status_store_is_a_file(ctx):
    (ctx.tmp / "store").write_text("mine")
    return "status", [f"store={ctx.tmp / 'store'}"], 4, "is a file, not a directory"


@case
def status_store_checkpoints_is_a_file(ctx):
    (ctx.tmp / "store").mkdir()
    (ctx.tmp / "store" / "checkpoints").write_text("mine")
    return "status", [f"store={ctx.tmp / 'store'}"], 4, "checkpoints is a file where kit keeps a folder"


@case
def status_store_records_is_a_file(ctx):
    (ctx.tmp / "store").mkdir()
    (ctx.tmp / "store" / "kit").write_text("mine")
    return "status", [f"store={ctx.tmp / 'store'}"], 4, "kit is a file where kit keeps a folder"


@case
def status_invalid_repo_id(ctx):
    return "status", ["store=hf://not a repo"], 2, "invalid Hugging Face repo id"


@case
def status_repo_id_with_dotdot(ctx):
    return "status", ["store=hf://me/../x"], 2, "invalid Hugging Face repo id"


@case
def status_hub_while_offline(ctx):
    ctx.monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return "status", [ctx.hub_store()], 4, "HF_HUB_OFFLINE is set"


@case
def status_silent_endpoint(ctx):
    url = silent_endpoint(ctx)
    ctx.monkeypatch.setenv("HF_ENDPOINT", url)
    ctx.monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", "1")
    return "status", ["store=hf://me/x"], 4, f"{url} did not answer within 1 s"


@case
def status_connection_refused(ctx):
    url = closed_port()
    ctx.monkeypatch.setenv("HF_ENDPOINT", url)
    return "status", ["store=hf://me/x"], 4, url


@case
def status_private_repo_without_token(ctx):
    spec = ctx.hub_store()
    ctx.monkeypatch.delenv("HF_TOKEN")
    return "status", [spec], 4, "no token was given (401)"


@case
def status_rejected_token(ctx):
    spec = ctx.hub_store()
    ctx.monkeypatch.setenv("HF_TOKEN", FAKE[:-4] + "XXXX")
    return "status", [spec], 4, "token rejected"


@case
def status_server_error_on_listing(ctx):
    spec = ctx.hub_store()
    # The client's five retries (all answered 500) still happen; its pauses between them (Retry-After: 0
    # plus its own 1 s each) are skipped: waiting is not what is tested.
    ctx.hub.inject("status", status=500, times=100, method="GET", path="/tree/", retry_after=0)
    import huggingface_hub.utils._http as hf_http

    class NoPause:  # huggingface_hub's own `time`, less the pauses (its module only)
        sleep = staticmethod(lambda seconds: None)

        def __getattr__(self, name):
            return getattr(time, name)

    ctx.monkeypatch.setattr(hf_http, "time", NoPause())
    return "status", [spec], 4, "HTTP 500"


@case
def status_timeout_setting_not_a_number(ctx):
    ctx.monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", "soon")
    return "status", [ctx.hub_store()], 2, "KIT_NETWORK_TIMEOUT_S='soon' must be a number of seconds above 0"


@case
def status_timeout_setting_negative(ctx):
    ctx.monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", "-5")
    return "status", [ctx.hub_store()], 2, "must be a number of seconds above 0"


@case
def status_timeout_setting_huge(ctx):  # 1e300 overflowed the socket timeout: exit 1, "a bug in kit"
    ctx.monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", "1e300")
    return "status", [ctx.hub_store()], 2, "at most 604800 (a week)"


# ---- store: the training script ------------------------------------------------------------------
@case
def script_store_is_a_file(ctx):
    (ctx.tmp / "store").write_text("mine")
    return "script", [f"store={ctx.tmp / 'store'}"], 4, "is a file, not a directory"


@case
def script_hub_while_offline(ctx):
    ctx.monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return "script", [ctx.hub_store()], 4, "HF_HUB_OFFLINE is set"


@case
def script_silent_endpoint(ctx):
    url = silent_endpoint(ctx)
    ctx.monkeypatch.setenv("HF_ENDPOINT", url)
    ctx.monkeypatch.setenv("KIT_NETWORK_TIMEOUT_S", "1")
    return "script", ["store=hf://me/x"], 4, url


@case
def script_hub_without_token(ctx):
    ctx.monkeypatch.delenv("HF_TOKEN")
    return "script", ["store=hf://me/new"], 4, "no Hugging Face token"


@case
def script_read_only_token(ctx):
    spec = ctx.hub_store()
    ctx.monkeypatch.setenv("HF_TOKEN", READ_TOKEN)
    return "script", [spec], 4, "no write access"


@case
def script_store_only_fails_transiently(ctx):
    spec = ctx.hub_store()
    ctx.hub.inject("status", status=503, times=10_000, method="GET", path="/resolve/[0-9a-f]+/checkpoints/")
    return "script", [spec], 4, "run again when it answers"


@case
def script_keep_checkpoints_zero(ctx):
    return "script", ["keep_checkpoints=0"], 2, "keep_checkpoints"


@case
def script_negative_squash_interval(ctx):
    return "script", ["squash_history_every=-1"], 2, "squash_history_every"


# ---- checkpoints and resume ----------------------------------------------------------------------
@case
def resume_missing_path(ctx):
    return "script", [f"resume={ctx.tmp / 'nope'}"], 2, "no such checkpoint folder"


@case
def resume_path_is_a_file(ctx):
    (ctx.tmp / "ckpt").write_text("x")
    return "script", [f"resume={ctx.tmp / 'ckpt'}"], 2, "no such checkpoint folder"


@case
def resume_path_corrupt_adapter(ctx):
    d = ctx.sealed(4)
    flip(d / "adapter_model.safetensors")
    return "script", [f"resume={d}"], 2, "adapter_model.safetensors sha256 differs"


@case
def resume_path_truncated_optimizer(ctx):
    d = ctx.sealed(4)
    (d / "optimizer.pt").write_bytes((d / "optimizer.pt").read_bytes()[:100])
    return "script", [f"resume={d}"], 2, "optimizer.pt has 100 bytes"


@case
def resume_path_file_missing(ctx):
    d = ctx.sealed(4)
    (d / "scheduler.pt").unlink()
    return "script", [f"resume={d}"], 2, "scheduler.pt is missing"


@case
def resume_path_manifest_not_json(ctx):
    d = ctx.sealed(4)
    (d / MANIFEST_NAME).write_text("{not json")
    return "script", [f"resume={d}"], 2, "is not valid JSON"


@case
def resume_path_manifest_lists_a_file_outside(ctx):  # counted as verified and resumed from (issue 33)
    import hashlib

    d = ctx.sealed(4)
    secret = ctx.tmp / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    doc = json.loads((d / MANIFEST_NAME).read_text())
    doc["files"]["../passwd"] = {"size": secret.stat().st_size, "sha256": hashlib.sha256(secret.read_bytes()).hexdigest()}
    (d / MANIFEST_NAME).write_text(json.dumps(doc))
    return "script", [f"resume={d}"], 2, "'../passwd', which leaves its checkpoint folder"


@case
def resume_vanilla_path_without_trainer_state(ctx):
    d = make_ckpt(ctx.tmp / "plain", 4, manifest=False)
    (d / "trainer_state.json").unlink()
    return "script", [f"resume={d}"], 2, "is not a Trainer checkpoint"


@case
def resume_vanilla_path_with_a_text_step(ctx):
    d = make_ckpt(ctx.tmp / "plain", 4, manifest=False)
    (d / "trainer_state.json").write_text('{"global_step": "four", "max_steps": 60}')
    return "script", [f"resume={d}"], 2, "trainer_state.json's global_step is \"four\", not a step count"


@case
def resume_vanilla_path_with_a_deep_trainer_state(ctx):
    d = make_ckpt(ctx.tmp / "plain", 4, manifest=False)
    (d / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000)
    return "script", [f"resume={d}"], 2, "trainer_state.json is not usable JSON (nested too deeply"


@case
def resume_never_with_checkpoints(ctx):
    ctx.sealed(4)
    return "script", ["resume=never"], 2, "resume=never, but"


@case
def resume_lora_rank_change_forced(ctx):
    ctx.sealed(4)
    return "script", ["lora.r=8", "--force"], 2, "lora.r: 16 (checkpoint) != 8 (config)"


@case
def resume_target_modules_change_forced(ctx):
    ctx.sealed(4)
    return "script", ["lora.target_modules=[q_proj]", "--force"], 2, "cannot be resumed, even with --force"


@case
def resume_full_over_adapter_forced(ctx):
    ctx.sealed(4)
    return "script", ["method=full", "--force"], 2, "cannot be resumed, even with --force"


@case
def resume_other_data_not_forced(ctx):
    ctx.sealed(4)
    other = ctx.tmp / "other.jsonl"
    other.write_text('{"text": "x"}\n')
    return "script", [f"data.path={other}"], 2, "pass --force"


@case
def resume_other_seq_len_not_forced(ctx):
    ctx.sealed(4)
    return "script", ["seq_len=64"], 2, "seq_len: 256 (checkpoint) != 64 (config)"


# ---- the harness ---------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_script(argv: list[str]) -> int:
    old = sys.argv
    sys.argv = [str(SCRIPT), *argv]
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        sys.argv = old
    return 0


@pytest.fixture
def ctx(tmp_path, monkeypatch):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "KIT_NETWORK_TIMEOUT_S"):
        monkeypatch.delenv(var, raising=False)
    # Whatever the caller exported: huggingface_hub reads HF_HUB_OFFLINE once, at import.
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(base, "FETCH_BACKOFF_S", (0.01,))
    monkeypatch.setenv("HF_TOKEN", FAKE)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.chdir(ROOT)
    with HubServer(tokens={WRITE_TOKEN: "write", READ_TOKEN: "read"}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield Ctx(tmp_path, server, monkeypatch)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input(ctx, capsys, name):
    entry, argv, code, words = CASES[name](ctx)
    argv = [f"output_dir={ctx.out}", *argv]  # overrides before any flag (argparse takes them in one run)
    before = snapshot(ctx.tmp)
    capsys.readouterr()
    got = cli.main(["status", *argv]) if entry == "status" else run_script(argv)
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert got == code, f"exit {got}, wanted {code}\n{err}"
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert words in errors[0], errors[0]
    assert "Traceback" not in out + err
    after = snapshot(ctx.tmp)
    lost = [p for p in before if p not in after or after[p] != before[p]]
    assert not lost, f"lost or overwritten: {lost}"
    assert FAKE not in out + err
    assert not [p for p, data in after.items() if FAKE.encode() in data], "the token was written to a file"


def test_there_are_enough_cases():
    assert len(CASES) >= 25


# ---- a full disk (issue 33, item 11) ---------------------------------------------------------------
def _one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert "Traceback" not in err
    return errors[0]


@pytest.mark.slow
def test_a_disk_too_small_for_the_next_checkpoint_stops_with_one_line_and_keeps_the_last(ctx):
    """A 1 MB tmpfs as output_dir: a raw SafetensorError traceback, exit 1. Now the save that would not fit is
    refused before a byte of it is written: one line naming the folder and the free space, exit 4; the
    checkpoints before it verify, and the same command resumes once there is room."""
    from kit.checkpoints.manifest import verify
    from tests.smalldisk import tmpfs

    with tmpfs(ctx.tmp / "small", "1M") as small:
        out = small / "run"
        # Real processes, as a user's runs are: an in-process run that raised would still hold output_dir's lock.
        r = train([f"output_dir={out}", "max_steps=6", "save_steps=2", "keep_checkpoints=3", "eval_steps=null"],
                  nproc=1)
        line = _one_error(r.stderr)
        assert r.returncode == 4, r.stderr[-3000:]
        assert f"no room for the next checkpoint in {out}" in line and "KiB free on its disk" in line, line
        ckpts = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
        assert ckpts == ["checkpoint-2"], ckpts  # ~460 KiB each: the one that fitted, whole
        assert verify(out / "checkpoint-2")[0]
        subprocess.run(["mount", "-o", "remount,size=4M", str(small)], check=True)  # room again
        # The run that ends well: in this process (runpy).
        r = train_here([f"output_dir={out}", "max_steps=6", "save_steps=2", "keep_checkpoints=1", "eval_steps=null"])
        assert r.returncode == 0, r.stderr[-3000:]
        assert "resuming from step 2" in r.stdout and "complete: step 6 of 6" in r.stdout


def test_a_disk_that_fills_up_during_a_save_is_one_line_and_the_partial_checkpoint_goes(tmp_path):
    """The save itself hits ENOSPC (safetensors wraps it in a SafetensorError): exit 4 naming the folder and
    its free space, the partial checkpoint folder removed, the sealed one before it kept."""
    import torch
    from safetensors.torch import save_file

    from kit.errors import StoreError
    from kit.train.disk import full_disk_stops
    from tests.smalldisk import tmpfs

    with tmpfs(tmp_path / "small", "256k") as small:
        out = small / "run"
        sealed = make_ckpt(out, 2, size=1024)
        with pytest.raises(StoreError) as e:
            with full_disk_stops(str(out)):
                (out / "checkpoint-4").mkdir()
                save_file({"w": torch.zeros(100_000)}, str(out / "checkpoint-4" / "adapter_model.safetensors"))
        assert e.value.exit_code == 4
        assert str(e.value).startswith(f"the disk of {out} is full (") and "free) while saving a checkpoint" in str(e.value)
        assert "the partial checkpoint-4 was removed, checkpoint-2 is kept" in str(e.value)
        assert not (out / "checkpoint-4").exists() and sealed.is_dir()
        with pytest.raises(StoreError, match="is full"):  # a plain write: OSError ENOSPC
            with full_disk_stops(str(out)):
                (out / "big.bin").write_bytes(b"\0" * (512 << 10))
        with pytest.raises(ValueError, match="not a disk"):  # anything else goes on as it was
            with full_disk_stops(str(out)):
                raise ValueError("not a disk problem")


@pytest.mark.slow
def test_a_disk_full_while_writing_final_is_one_line_and_the_next_run_writes_it(ctx):
    """A session cut after its last checkpoint, then the disk filled: the wrap-up's final/ does not fit. One
    line, exit 4, no half final/; with room again the same command writes final/ without training."""
    from tests.smalldisk import fill, tmpfs

    with tmpfs(ctx.tmp / "small", "2M") as small:
        out = small / "run"
        args = [f"output_dir={out}", "max_steps=2", "save_steps=2", "keep_checkpoints=1", "eval_steps=null"]
        # The runs that end well run in this process (runpy); the one refused, as a user's, in a process of its own.
        r = train_here(args)
        assert r.returncode == 0, r.stderr[-3000:]
        shutil.rmtree(out / "final")  # the cut before final/ was written
        filler = fill(small, leave=40 << 10)
        r = train(args, nproc=1)
        line = _one_error(r.stderr)
        assert r.returncode == 4 and f"the disk of {out} is full" in line and "while writing final/" in line, line
        assert not (out / "final").exists() and not list(out.glob(".final*"))
        assert (out / "checkpoint-2").is_dir()
        filler.unlink()
        r = train_here(args)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (out / "final" / "eval_results.json").is_file()
