"""`python -m kit …` and `%run -m kit …`."""

import sys

from kit.cli import finish_in_script, run

if __name__ == "__main__":
    finish_in_script(run(sys.argv[1:]), globals())
