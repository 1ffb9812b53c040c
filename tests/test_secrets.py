"""The token never leaves the environment: a scheduled run that pushes to a Hub store with a fake
token, then `kit status`; the token must appear in no output notebook, no stdout/stderr, no file
under the output or runs folder, and no file pushed to the (test) Hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hubserver import HubServer
from tests.test_schedule import BUDGET, LONG, hub_env, kit, schedule_args

pytest.importorskip("papermill")

FAKE = "hf_" + "FAKEtokenFORtestsONLY0123456789abcd"  # built, so no token-like literal is committed


def files_under(*roots: Path):
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                yield path


@pytest.mark.slow
def test_the_token_appears_nowhere(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    with HubServer(tokens={FAKE: "write"}) as server:
        env = hub_env(server.url, token=FAKE)
        sched = kit(schedule_args(runs, out, "hf://me/secret", *BUDGET), env)
        status = kit(["status", "--config", "configs/default.yaml", *LONG, f"output_dir={out}",
                      "store=hf://me/secret", "--json"], env)
        pushed = server.files("me/secret")
    assert sched.returncode == 0, (sched.stdout + sched.stderr)[-3000:]
    assert "outcome: paused at step" in sched.stdout
    assert status.returncode == 0 and '"latest_step"' in status.stdout, status.stderr[-2000:]
    # The token was really used: the store was written with it.
    assert "kit/lease.json" in pushed and any(p.startswith("checkpoints/") for p in pushed)

    needle = FAKE.encode()
    for name, text in (("schedule stdout", sched.stdout), ("schedule stderr", sched.stderr),
                       ("status stdout", status.stdout), ("status stderr", status.stderr)):
        assert FAKE not in text, name
    seen = list(files_under(runs, out))
    assert any(p.suffix == ".ipynb" for p in seen) and any(p.name == "trainer_state.json" for p in seen)
    for path in seen:
        assert needle not in path.read_bytes(), path
    for name, data in pushed.items():
        assert needle not in data, name


def test_a_token_override_is_refused_before_anything_is_written(tmp_path):
    r = kit(schedule_args(tmp_path / "runs", tmp_path / "out", str(tmp_path / "store"), f"HF_TOKEN={FAKE}"),
            hub_env("http://127.0.0.1:9", token="hf_other"), timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: refusing to pass a token")
    assert FAKE not in r.stdout + r.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
