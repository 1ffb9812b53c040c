"""Launcher so that `%run kit bootstrap` works in a notebook.

IPython's `%run` cannot run a directory (ipython/ipython#12081), so this file sits beside the
`kit/` package: it puts its own folder first on `sys.path` and calls the CLI. From another
folder: `%run path/to/repo/kit bootstrap`. Installed with pip: `%run -m kit bootstrap`.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if os.path.isfile(os.path.join(_here, "kit", "__init__.py")):
    if _here not in sys.path:
        sys.path.insert(0, _here)
else:  # copied away from its package: `import kit` would find this file again, and again
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
# This file is itself named `kit`; make sure `import kit` finds the package, not this module.
if getattr(sys.modules.get("kit"), "__file__", None) == os.path.abspath(__file__):
    del sys.modules["kit"]

try:
    from kit.cli import finish_in_script, run  # noqa: E402
except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] != "kit":
        raise
    print(f"error: {__file__} is kit's launcher, but the kit package is neither beside it nor installed: run it "
          "from the kit checkout, or `pip install -e PATH_TO_KIT`", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    finish_in_script(run(sys.argv[1:]), globals())
