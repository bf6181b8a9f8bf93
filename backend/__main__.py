"""`python -m backend ...`: the command line (tools/cli.py), the one entry point that imports the tools."""
import sys

from .tools.cli import main

sys.exit(main())
