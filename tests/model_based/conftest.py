"""The model-based suites: hypothesis state machines over the core and over the real runtime.

``jobmodel.py`` is shared with the mutation proof (``tests/mutants``), so this folder is on
``sys.path`` and the module is imported by its own name.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)
