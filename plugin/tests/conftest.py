"""Plugin test setup: import the package from plugin/src and the shared builders from here."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for path in (HERE.parent / "src", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
