"""`python -m lab.host.cli`: the `lab` command."""

import sys

from lab.host.cli import main

if __name__ == "__main__":
    sys.exit(main())
