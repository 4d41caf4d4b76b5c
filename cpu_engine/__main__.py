"""``python -m cpu_engine``: the CPU torch engine as its own OS process."""

import sys

from cpu_engine.cli import main

sys.exit(main())
