"""`python -m edgecap ...` runs the `edgecap` command (for a venv whose bin/ is not on PATH)."""

import sys

from edgecap.cli import main

if __name__ == "__main__":
    sys.exit(main())
