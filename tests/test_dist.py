"""kit.train.dist.teardown under a real torchrun with 2 gloo ranks: how a finished job leaves."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.scripts import ROOT, cpu_env, run, torchrun_cmd, train_here
from tests.scripts import SCRIPT as SCRIPT_PATH

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from kit.train import dist

ctx = dist.init()
ok, code = False, 1
try:
    print(f"rank {{ctx.rank}} of {{ctx.world_size}} on {{ctx.backend}}", end="")  # no newline: must be flushed
    if {fail!r} and ctx.rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    code = {code}
    ok = True
finally:
    dist.teardown(ok, exit_code=code)
print("after teardown")  # only a process that was not ended by teardown gets here
"""


def _job(tmp_path, code: int, fail: bool = False):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT.format(root=str(ROOT), code=code, fail=fail)))
    return run(torchrun_cmd(script), timeout=120)


@pytest.mark.slow
def test_a_clean_finish_exits_with_its_code_and_flushed_output(tmp_path):
    # The exit code a finished job chose (0, or 1 for a failed smoke check) is what torchrun
    # returns, and what was printed is not lost to the immediate exit.
    done = _job(tmp_path, code=0)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0 of 2 on gloo" in done.stdout and "rank 1 of 2 on gloo" in done.stdout
    assert "after teardown" not in done.stdout
    assert "destroy_process_group() was not called" not in done.stderr
    assert _job(tmp_path, code=5).returncode != 0


@pytest.mark.slow
def test_a_failed_rank_is_not_ended_quietly(tmp_path):
    # The failing rank's exception propagates (its traceback is the user's clue), and the job fails.
    done = _job(tmp_path, code=0, fail=True)
    assert done.returncode != 0
    assert "rank 1 failed on purpose" in done.stderr


AGREE = """
import sys
sys.path.insert(0, {root!r})
from kit.errors import KitError
from kit.train import dist, last_word

def main():
    ctx = dist.init()
    ok, code = False, 1
    try:
        # What each rank settled for itself; {differ!r}: rank 1 saw less free GPU memory.
        batch = 4 if {differ!r} and ctx.rank == 1 else 8
        dist.same_on_every_rank({{"per_device_batch": batch, "grad_accum": 16 // batch, "precision": "fp32"}}, "the plan")
        print(f"rank {{ctx.rank}} agreed", flush=True)
        code, ok = 0, True
        return code
    finally:
        dist.teardown(ok, exit_code=code)

try:
    sys.exit(main())
except KitError as e:  # as train_ddp.py does
    last_word.say_error(e)
    sys.exit(e.exit_code)
"""


def _agree(tmp_path, differ: bool):
    script = tmp_path / "agree.py"
    script.write_text(textwrap.dedent(AGREE.format(root=str(ROOT), differ=differ)))
    return run(torchrun_cmd(script), timeout=120)


@pytest.mark.slow
def test_ranks_that_planned_differently_stop_before_training_instead_of_hanging(tmp_path):
    same = _agree(tmp_path, differ=False)
    assert same.returncode == 0 and same.stdout.count("agreed") == 2, same.stderr[-2000:]
    # A rank with another batch would make other collective calls per step: a hang under NCCL.
    # Both ranks stop at once, exit 3, one line naming the rank and the difference.
    done = _agree(tmp_path, differ=True)
    assert done.returncode != 0 and "agreed" not in done.stdout
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith(
        "error: rank 1 settled the plan differently from rank 0 (grad_accum 2 vs 4; per_device_batch 8 vs 4): the "
        "machine changed while the ranks planned (e.g. another process took GPU memory); run again"), errors
    assert "kit exit 3" in errors[0], errors


@pytest.mark.slow
@pytest.mark.parametrize("env, want, waits", [
    ({"WORLD_SIZE": "2", "RANK": "0"}, "but MASTER_ADDR and MASTER_PORT not set: launch with torchrun", False),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"},
     "MASTER_PORT='abc' is not a port number", False),
    # A rank alone, then a peer address nobody answers on: both waited torch's 30-minute timeout.
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29577", "KIT_RENDEZVOUS_S": "4"},
     "rank 0 of WORLD_SIZE 2 waited 4 s at 127.0.0.1:29577 for the other ranks", True),
    ({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "no-such-host.invalid", "MASTER_PORT": "29577",
      "KIT_RENDEZVOUS_S": "4"}, "rank 1 of WORLD_SIZE 2 waited 4 s at no-such-host.invalid:29577", True),
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29577", "KIT_RENDEZVOUS_S": "soon"},
     "KIT_RENDEZVOUS_S='soon' must be a number of seconds above 0", False),
    # 1e300 s overflowed threading.Timer: a traceback, then torch's own 30-minute wait
    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29577", "KIT_RENDEZVOUS_S": "1e300"},
     "KIT_RENDEZVOUS_S='1e300' must be a number of seconds above 0 and at most 604800", False),
], ids=["no-master-addr", "bad-port", "rank-alone", "unknown-host", "bad-wait", "huge-wait"])
def test_a_rank_launched_without_its_peers_is_one_line_exit_2_not_a_hang(tmp_path, env, want, waits):
    args = [f"output_dir={tmp_path / 'o'}", "max_steps=2"]
    if waits:  # a rank that gave up waiting ends its process itself (os._exit): a process of its own
        done = run([sys.executable, str(SCRIPT_PATH), *args], env=cpu_env(**env), timeout=120)
    else:  # refused before any rendezvous: the script's __main__ in this process, as `python train_ddp.py`
        done = train_here(args, env=cpu_env(**env))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and want in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_under_torchrun_the_first_rank_to_stop_says_the_error_and_the_others_stay_quiet(monkeypatch, tmp_path, capsys):
    # One launch (its run id and agent): whichever rank claims first says the line; the claim is what another
    # rank's crash in a collective is checked against. Outside torchrun a process always speaks.
    from kit.errors import UsageError
    from kit.train import last_word

    monkeypatch.setattr(last_word.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setattr(last_word, "repeat_after_torchrun", lambda *a, **k: False)  # no watcher: no agent here
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert last_word.claim_error() is True and not last_word.another_rank_said_it(wait_s=0)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-a")
    monkeypatch.setenv("RANK", "1")
    assert not last_word.another_rank_said_it(wait_s=0.1)
    last_word.say_error(UsageError("rank 1 only"))
    assert capsys.readouterr().err.lstrip("\n").startswith("error: rank 1 only")  # on a line of its own
    monkeypatch.setenv("RANK", "0")
    assert last_word.another_rank_said_it(wait_s=0)
    last_word.say_error(UsageError("the same, from rank 0"))
    assert capsys.readouterr().err == ""  # rank 1 said it first
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-b")  # the next launch speaks again
    last_word.say_error(UsageError("next launch"))
    assert "error: next launch" in capsys.readouterr().err
