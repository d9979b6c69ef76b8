"""`python -m bench`: the peer comparison (see bench/harness.py)."""

import sys

from bench.harness import main

sys.exit(main())
