"""Make the stateful suite (``tests/property``, package ``property``) importable from here.

Under ``--import-mode=importlib`` pytest puts no test directory on ``sys.path``; the mutation
proof reuses the property suite's state machines, so ``tests/`` is appended (appended, not
prepended: the project's own top-level packages keep precedence over same-named test folders).
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
