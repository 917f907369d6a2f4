"""`python -m dsfast.launcher ...` is the same as the `dsfast` command."""
import sys

from .cli import main

sys.exit(main())
