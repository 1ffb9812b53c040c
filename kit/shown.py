"""How kit shows text it did not write: escaped, so it cannot recolour a terminal, forge a line
or read backwards, and bounded in length.

Used by kit.errors (every error line), kit.redaction's guarded stdout/stderr and every report. It
imports nothing of kit's.
"""

import re
from pathlib import PurePath

SHOWN_LIMIT = 200  # characters of one echoed value (a key, a path, a setting) in a message
# What must not reach a terminal raw: C0/C1 controls (newline, carriage return, ESC, which starts a
# colour or cursor sequence), DEL, the soft hyphen and other invisible format characters, bidi
# embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069, which make a name read
# backwards), zero-width characters, line/paragraph separators, the BOM, interlinear annotations,
# tag characters and lone surrogates (an undecodable byte of a file name).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u206f\u3164\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value, limit: int | None = SHOWN_LIMIT, *, quote: bool = False, keep: str = "",
          word_limit: int | None = None) -> str:
    """`value` as it may be printed on a terminal: every character that could recolour it, move its
    cursor, start a line of its own or make text read backwards shown escaped as Python writes it
    (`\\n`, `\\x1b`, `\\u202e`), and the whole cut to `limit` characters with an ellipsis.

    The one way kit puts a string it did not write (a path, a name, a GPU name, a repo id, a setting,
    a value from the store or the data) into a message, a plan, a report or a note. `quote` gives
    it in quotes as `repr` does (for `got 'x'`); `keep` lists characters let through (the newlines
    of kit's own multi-line output); `word_limit` cuts each run without a space the same way (a
    message that echoes a 100 kB path or value it did not cut itself). Non-strings are shown by
    their `repr` (paths by their text).

        shown("GPU\\n\\x1b[31mred")     # 'GPU\\\\n\\\\x1b[31mred'
        shown("x" * 10_000, 5)         # 'xxxxx… (10,000 characters)'
    """
    if isinstance(value, PurePath):  # a path is shown as its text, not as PosixPath('…')
        value = str(value)
    text = value if isinstance(value, str) else repr(value)
    if word_limit is not None and len(text) > word_limit:
        text = re.sub(f"\\S{{{word_limit + 1},}}", lambda m: shown(m.group(), word_limit, quote=False, keep=keep), text)
    cut = limit is not None and len(text) > limit
    head = text[:limit] if cut else text
    if quote and isinstance(value, str):
        head = repr(head)  # repr escapes every character str.isprintable() refuses: a superset of _UNSAFE
    head = _UNSAFE.sub(lambda m: _escape(m.group()) if m.group() not in keep else m.group(), head)
    return f"{head}… ({len(text):,} characters)" if cut else head


def _escape(c: str) -> str:
    n = ord(c)
    return _NAMED.get(c) or (f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
