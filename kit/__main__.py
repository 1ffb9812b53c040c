"""`python -m kit …` and `%run -m kit …`."""

import sys

from kit.cli import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    # In IPython (`%run -m kit`), SystemExit(0) is noise; only a failure is worth raising.
    if code:
        sys.exit(code)
