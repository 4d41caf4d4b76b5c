"""The tertius backend's server: the project's CPU engine, run as a program of its own (its command line, its
``READY`` line and its SGLang-shaped HTTP API are the CPU engine's)."""

import sys

from engines.cpu.cli import main

if __name__ == "__main__":
    sys.exit(main())
