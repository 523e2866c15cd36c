import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ddp_run(tmp_path):
    from tracebuild import make_ddp_run
    return make_ddp_run(tmp_path / "ddp")
