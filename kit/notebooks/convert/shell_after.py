"""Shell lines and cells that ran after training: run them there, on rank 0, as the notebook did.

Before training a `!` line is setup (`!nvidia-smi`, `!git clone …`): every rank would run it, so it
is listed to run before torchrun. After training the Python below it often needs what it made
(`!wget URL` then `whisper("file.flac")`, `!git clone …` then `%cd repo`): dropped, that Python fails
on rank 0, maybe before the notebook's own save. So a one-line `!cmd` there becomes
`subprocess.run("cmd", shell=True)` in place, run where the code after training runs: on rank 0
alone, and a `%%bash` (`%%sh`, `%%script bash`) cell runs whole through bash the same way. Like
IPython it does not stop on a failing command. Left out, and flagged as before: installs, `%`
magics, lines continued with `\\`, lines inside a block (already a REVIEW), IPython's `{var}`/`$var`
expansion, and any line holding a token.

One rule for services: a cell that starts one (`nohup vllm serve … &`, `docker run -d …`) and the
cells that use it (a request to its localhost port, `docker stop NAME`) are kept or dropped together;
where kit cannot run the start, the users are dropped with it. An interactive login
(`!huggingface-cli login`, `!hf auth login`, `!wandb login` without a key) is never run: it waits at a
prompt nobody answers under torchrun.
"""

from __future__ import annotations

import re
import shlex

from kit.redaction import redact
from kit.notebooks.convert.cells import is_install, parse_cell, read_code_cells, strip_magics
from kit.notebooks.convert.syntax import Change, clip

SHELL_MAGICS = ("%%bash", "%%sh", "%%shell", "%%script bash", "%%script sh")
SERVICE = re.compile(r"(?m)\bnohup\b|&\s*$|\bdocker\s+run\b[^\n]*\s-d\b|\bserve\b")
PORT = re.compile(r"(?:--port[= ]|-p\s+|:)(\d{2,5})\b")
NAME = re.compile(r"--name[= ](\S+)")
LOCAL = re.compile(r"(?:localhost|127\.0\.0\.1|0\.0\.0\.0):(\d{2,5})")


def interactive_login(text: str) -> bool:
    """`huggingface-cli login`, `hf auth login`, `wandb login` with no token or key: it prompts."""
    try:
        words = shlex.split(text.lstrip("!% "))
    except ValueError:
        return False
    if words[:2] in (["huggingface-cli", "login"], ["hf", "login"]) or words[:3] == ["hf", "auth", "login"]:
        return not any(w.startswith("--token") for w in words)
    if words[:2] == ["wandb", "login"]:
        return not [w for w in words[2:] if not w.startswith("-")]
    return False


def portable(text: str) -> bool:
    return (text.startswith("!") and not is_install(text) and not text.endswith("\\")
            and not any(c in text for c in "{}$") and redact(text) == text and bool(text[1:].strip())
            and not interactive_login(text))


def shell_cell(source: str) -> tuple[str, str] | None:
    """(magic line, body) of a `%%bash`-like cell, else None."""
    lines = source.splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None or not lines[first].strip().startswith(SHELL_MAGICS):
        return None
    return lines[first].strip(), "\n".join(lines[first + 1:]).strip("\n") + "\n"


def _bash_python(magic: str, body: str, cell: int) -> str:
    text = repr(body) if "'''" in body or "\\" in body else f"'''\\\n{body}'''"
    return (f"import subprocess\nsubprocess.run({text}, shell=True, executable='/bin/bash')  "
            f"# kit: was the `{magic}` cell {cell}\n")


def _handles(text: str) -> tuple[set[str], set[str]]:
    """(ports, container names) a service start names."""
    return set(PORT.findall(text)), set(NAME.findall(text))


def _uses(text: str, ports: set[str], names: set[str]) -> bool:
    if any(p in ports for p in LOCAL.findall(text)) or (not ports and LOCAL.search(text)):
        return True
    return any(re.search(rf"\b(?:docker|podman)\s+(?:stop|kill|rm|logs|exec)\b.*\b{re.escape(n)}\b", text)
               for n in names)


def port_after(path, parsed: list, dropped: list, end: tuple[int, int] | None, changes: list[Change],
               token_required: bool = False):
    """(parsed cells, dropped lines) with the portable lines and shell cells after `end` (training's last
    line) run in place, services kept or dropped with their users, interactive logins dropped."""
    if end is None:
        return parsed, dropped
    sources = dict(read_code_cells(path))
    logins = [d for d in dropped if (d[0], d[1]) >= end and interactive_login(d[2])]
    why = ("the script already requires HF_TOKEN at the top" if token_required else
           "log in in a terminal before launching (or set HF_TOKEN / WANDB_API_KEY)")
    for cell, _, text in logins:
        changes.append(Change(cell, f"`{clip(redact(text), 50)}` dropped: an interactive login waits at a prompt "
                                    f"that nobody answers under torchrun; {why}"))
    dropped = [d for d in dropped if d not in logins]
    every = {c: s for c, src in sources.items() if (s := shell_cell(src)) is not None}
    shells = {c: s for c, s in every.items() if c > end[0]}
    ran = {c for c, (_, body) in shells.items() if redact(body) == body}
    ported = {(c, n): t for c, n, t in dropped if (c, n) >= end and portable(t)}
    # A service kit cannot start (a token in its cell, IPython's `$var`) takes the cells that use it along.
    starts = [(c, body) for c, (_, body) in shells.items() if c not in ran and SERVICE.search(body)]
    starts += [(c, t) for c, n, t in dropped if (c, n) >= end and (c, n) not in ported and SERVICE.search(t)]
    gone: dict[int, int] = {}
    for start, text in sorted(starts):
        ports, names = _handles(text)
        for c, src in sources.items():
            if c > start and c not in gone and _uses(src, ports, names):
                gone[c] = start
    for c, start in gone.items():
        changes.append(Change(c, f"dropped with cell {start}, which starts the service this cell uses and which "
                                 "kit cannot run here: run both by hand once the script has finished", True))
    ran -= set(gone)
    ported = {k: t for k, t in ported.items() if k[0] not in gone}
    dropped = [d for d in dropped if d[0] not in gone]
    # A shell cell kit does not run is listed line by line with the other shell lines (to run before
    # launching, or after the script), instead of vanishing.
    for c, (_, body) in every.items():
        if c in ran or c in gone:
            continue
        dropped += [(c, n, t.strip()) for n, t in enumerate(body.splitlines(), 2) if t.strip()
                    and not t.strip().startswith("#")]
        changes[:] = [x for x in changes if not (x.cell == c and x.text.startswith("dropped the whole cell"))]
    dropped.sort(key=lambda d: d[:2])
    out = []
    lines = {c: {n for c2, n in ported if c2 == c} for c, _ in ported}
    for cell, tree, module, comment_only in parsed:
        if cell in gone:
            continue
        if cell in lines and cell in sources:
            code = strip_magics(sources[cell], cell, [], None, port=lines[cell])
            tree, module = parse_cell(code, cell)
            shown = ", ".join(f"`{clip(t, 50)}`" for (c, _), t in ported.items() if c == cell)
            changes.append(Change(cell, f"{shown}: ran after training in the notebook, and the code after it may "
                                        "need what it made: it runs there, on rank 0, through subprocess.run"))
        out.append((cell, tree, module, comment_only))
    for cell in sorted(ran):
        magic, body = shells[cell]
        kept = "\n".join(line for line in body.splitlines() if not interactive_login(line)) + "\n"
        if kept != body:
            changes.append(Change(cell, f"an interactive login dropped from the `{magic}` cell: it waits at a "
                                        f"prompt that nobody answers under torchrun; {why}"))
        tree, module = parse_cell(_bash_python(magic, kept, cell), cell)
        changes[:] = [c for c in changes if not (c.cell == cell and c.text.startswith("dropped the whole cell"))]
        changes.append(Change(cell, f"the `{magic}` cell ran after training in the notebook: it runs there, on rank 0, "
                                    "through bash (subprocess.run), so a service it starts and the cells that use "
                                    "it stay together"))
        at = next((i for i, p in enumerate(out) if p[0] > cell), len(out))
        out.insert(at, (cell, tree, module, False))
    return out, [d for d in dropped if (d[0], d[1]) not in ported]
