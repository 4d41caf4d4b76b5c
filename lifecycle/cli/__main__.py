"""``python -m lifecycle.cli``: the ``lifecycle`` command (tests run it as a real subprocess)."""

import sys

from lifecycle.cli import main

sys.exit(main())
