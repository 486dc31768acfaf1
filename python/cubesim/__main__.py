"""`python3 -m cubesim ...`: the command line (cubesim/cli.py)."""
import sys

from .cli import main

sys.exit(main())
