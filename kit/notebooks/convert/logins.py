"""How a notebook logs in and reads its secrets: the Hub login calls, the platform secret stores
(Colab userdata, Kaggle secrets) and what each lookup becomes in a script that torchrun starts."""

from __future__ import annotations

import libcst as cst

from kit.notebooks.convert.syntax import code, kwarg

HUB_LOGINS = {f"{m}{f}" for m in ("", "huggingface_hub.") for f in ("login", "notebook_login", "interpreter_login")}
PLATFORM_MODULES = ("google.colab", "kaggle_secrets")
HF_SECRET_WORDS = ("HF", "HUGGING")


def token_arg(call: cst.Call) -> cst.BaseExpression | None:
    """The token a login call passes (`login(token=x)` or `login(x)`), if any."""
    arg = kwarg(call, "token") or (call.args[0] if call.args and call.args[0].keyword is None else None)
    return None if arg is None else arg.value


def secret_lookup(name_node: cst.BaseExpression, os_name: str = "os") -> str:
    """An HF token through huggingface_hub's own resolution; any other secret from the environment
    (`os_name`: what the os module is called where the lookup runs)."""
    label = name_node.evaluated_value.upper() if isinstance(name_node, cst.SimpleString) else ""
    if any(w in label for w in HF_SECRET_WORDS):
        return "huggingface_hub.get_token()"
    if "WANDB" in label:
        return f'{os_name}.environ.get("WANDB_API_KEY")'  # the name the W&B client itself reads
    return f"{os_name}.environ.get({code(name_node)})"
