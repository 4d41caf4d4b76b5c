"""``python -m engines.cpu``: the CPU torch engine as its own OS process."""

import sys

from engines.cpu.cli import main

sys.exit(main())
