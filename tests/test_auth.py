"""Token lookup order and redaction. Kaggle's and Colab's secret clients cannot exist here, so
they are the one thing faked: small modules injected into sys.modules with the same names, call
signatures and exception classes as the real ones."""

import logging
import sys
import types

import pytest
from huggingface_hub import constants as hf_constants

from kit import auth
from kit.redaction import redact
from kit.errors import StoreError
from kit.checkpoints.store.hub import HubStore
from tests.hubserver import WRITE_TOKEN, hub  # noqa: F401  (fixture)
from tests.test_store import REPO, make_ckpt

FAKE = "hf_fakeSECRETvalue0123456789"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "KAGGLE_KERNEL_RUN_TYPE", "COLAB_RELEASE_TAG", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub.get_token() also reads the token file `hf auth login` writes: none here.
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-token"))
    monkeypatch.setattr(auth.os.path, "isdir", lambda p: False if p == "/kaggle/working" else _isdir(p))


_isdir = auth.os.path.isdir


def fake_kaggle(monkeypatch, value=None, error=None):
    mod = types.ModuleType("kaggle_secrets")

    class BackendError(Exception):
        pass

    class ValidationError(Exception):
        pass

    class UserSecretsClient:
        def get_secret(self, label):
            assert label == "HF_TOKEN"
            if error:
                raise {"backend": BackendError, "validation": ValidationError}[error]("no such secret")
            return value

    mod.UserSecretsClient, mod.BackendError, mod.ValidationError = UserSecretsClient, BackendError, ValidationError
    monkeypatch.setitem(sys.modules, "kaggle_secrets", mod)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")


def fake_colab(monkeypatch, value=None, error=None):
    google = types.ModuleType("google")
    colab = types.ModuleType("google.colab")
    userdata = types.ModuleType("google.colab.userdata")

    class SecretNotFoundError(Exception):
        pass

    class NotebookAccessError(Exception):
        pass

    def get(key):
        if error:
            raise {"missing": SecretNotFoundError, "access": NotebookAccessError}[error](key)
        return value

    userdata.get, userdata.SecretNotFoundError, userdata.NotebookAccessError = get, SecretNotFoundError, NotebookAccessError
    colab.userdata, google.colab = userdata, colab
    for name, mod in (("google", google), ("google.colab", colab), ("google.colab.userdata", userdata)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_env_order(monkeypatch):
    assert auth.find_token() is None and auth.token_source() is None
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_second")
    assert auth.find_token() == "hf_second"
    monkeypatch.setenv("HF_TOKEN", " hf_first \n")
    assert auth.find_token() == "hf_first" and auth.token_source() == "HF_TOKEN env"


def test_hf_auth_login_token_file(monkeypatch, tmp_path):
    (tmp_path / "hf-token").write_text("hf_fromTheLoginFile\n")
    assert auth.find_token() == "hf_fromTheLoginFile" and auth.token_source().startswith("hf auth login (")
    fake_kaggle(monkeypatch, value="hf_kaggle")
    assert auth.find_token() == "hf_fromTheLoginFile", "huggingface_hub's own sources come before Kaggle's"
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert auth.find_token() == "hf_env" and auth.token_source() == "HF_TOKEN env"


def test_kaggle_secret_only_on_kaggle(monkeypatch):
    fake_kaggle(monkeypatch, value="hf_kaggle")
    assert auth.find_token() == "hf_kaggle" and auth.token_source() == "Kaggle secret"
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE")
    assert auth.find_token() is None, "not on Kaggle: the Kaggle client is not consulted"


@pytest.mark.parametrize("error", ["backend", "validation"])
def test_kaggle_secret_missing(monkeypatch, error, caplog):
    fake_kaggle(monkeypatch, error=error)
    with caplog.at_level(logging.INFO, "kit.auth"):
        assert auth.find_token() is None
    assert "no Kaggle secret" in caplog.text and "HF_TOKEN" in caplog.text


def test_kaggle_without_its_module(monkeypatch):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.setitem(sys.modules, "kaggle_secrets", None)  # import fails
    assert auth.find_token() is None


def test_colab_secret(monkeypatch):
    fake_colab(monkeypatch, value="hf_colab")
    assert auth.find_token() == "hf_colab" and auth.token_source() == "Colab secret"


@pytest.mark.parametrize("error", ["missing", "access"])
def test_colab_secret_errors(monkeypatch, error, caplog):
    fake_colab(monkeypatch, error=error)
    with caplog.at_level(logging.INFO, "kit.auth"):
        assert auth.find_token() is None
    assert "no usable Colab secret" in caplog.text


def test_colab_detected_but_module_missing(monkeypatch):
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab")
    monkeypatch.setitem(sys.modules, "google.colab", None)
    assert auth.find_token() is None


def test_env_beats_secrets(monkeypatch):
    fake_kaggle(monkeypatch, value="hf_kaggle")
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert auth.find_token() == "hf_env"


def test_redact(monkeypatch):
    assert redact(f"url?t={FAKE} and {FAKE}", FAKE) == "url?t=*** and ***"
    monkeypatch.setenv("HF_TOKEN", FAKE)
    assert redact(f"Bearer {FAKE}") == "Bearer ***"
    assert redact("nothing here") == "nothing here"


def test_token_never_appears_in_logs_or_errors(hub, monkeypatch, tmp_path, caplog):
    """Drive every Hub error path with a fake token, then search all text for it."""
    hub.tokens[FAKE] = "read"
    texts = []
    with caplog.at_level(logging.DEBUG):
        monkeypatch.setenv("HF_TOKEN", FAKE)
        store = HubStore(REPO, endpoint=hub.url)  # token from the environment
        texts += [repr(store), store.describe(), str(vars(store).get("repo_id"))]
        HubStore(REPO, token=WRITE_TOKEN, endpoint=hub.url).ensure_repo()
        for call in (lambda: store.publish(make_ckpt(tmp_path, 1), 1, keep=1),
                     lambda: store.write_text("job.json", "{}")):
            with pytest.raises(StoreError) as err:
                call()
            texts.append(str(err.value))
        hub.tokens.pop(FAKE)  # now the token is invalid: 401 paths
        with pytest.raises(StoreError) as err:
            store.latest_valid()
        texts.append(str(err.value))
        hub.inject("hang", seconds=3, method="GET")
        with pytest.raises(StoreError) as err:
            HubStore(REPO, token=FAKE, endpoint=hub.url, timeout_s=0.5).latest_valid()
        texts.append(str(err.value))
    texts.append(caplog.text)
    joined = "\n".join(texts)
    assert "403" in joined and "401" in joined
    assert FAKE not in joined


@pytest.mark.slow
@pytest.mark.parametrize("preload", [[], ["-p", "huggingface_hub.constants"]], ids=["plain", "hub-imported-first"])
def test_suite_does_not_depend_on_the_callers_hf_environment(tmp_path, preload):
    """Item 5b of issue 11: with HF_HUB_OFFLINE=1 exported (Kaggle, offline setups), a stray token
    and endpoint, the token test still runs against the local test Hub and passes — also when a
    pytest plugin imported huggingface_hub (which reads HF_HUB_OFFLINE once) before conftest.py."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_TOKEN": "hf_" + "callerTOKEN" * 3,
           "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *preload,
                           "tests/test_auth.py::test_token_never_appears_in_logs_or_errors"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout


def test_scrub_file_replaces_the_token_in_a_file_kit_keeps(tmp_path, monkeypatch):
    from kit.auth import scrub_file

    token = "hf_" + "inAkernelLOG" + "0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", token)
    log = tmp_path / "kernel.log"
    log.write_bytes(b"\xff not utf-8, then " + token.encode() + b" and an unrelated hf_" + b"x" * 30 + b"\n")
    assert scrub_file(log) is True
    assert log.read_bytes() == b"\xff not utf-8, then *** and an unrelated ***\n"
    assert scrub_file(log) is False and scrub_file(tmp_path / "none.log") is False
