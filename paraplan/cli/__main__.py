"""`python -m paraplan.cli` runs the command line (as `python -m paraplan` does)."""

import sys

from . import main

sys.exit(main())
