import sys
from pathlib import Path

import pytest

# Let tests import their helpers (tests/scripted.py) as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"shared corpora not found at {SHARED_DATA}")
    return SHARED_DATA
