"""Make the model-based suite's job model (``tests/model_based/jobmodel.py``) importable as ``jobmodel``.

Under ``--import-mode=importlib`` pytest puts no test directory on ``sys.path``; the mutation proof
reuses the model-based suite's state machines. Only that folder is appended, never ``tests/`` itself,
whose folders are named after the project's packages (``tests/lifecycle`` would shadow ``lifecycle``).
"""

import sys
from pathlib import Path

_MODEL_BASED = str(Path(__file__).resolve().parents[1] / "model_based")
if _MODEL_BASED not in sys.path:
    sys.path.append(_MODEL_BASED)
