"""Launcher so that `%run kit bootstrap` works in a notebook.

IPython's `%run` cannot run a directory (ipython/ipython#12081), so this file sits beside the
`kit/` package: it puts its own folder first on `sys.path` and calls the CLI. From another
folder: `%run path/to/repo/kit bootstrap`. Installed with pip: `%run -m kit bootstrap`.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)
# This file is itself named `kit`; make sure `import kit` finds the package, not this module.
if getattr(sys.modules.get("kit"), "__file__", None) == os.path.abspath(__file__):
    del sys.modules["kit"]

from kit.cli import finish_in_script, run  # noqa: E402

if __name__ == "__main__":
    finish_in_script(run(sys.argv[1:]), globals())
