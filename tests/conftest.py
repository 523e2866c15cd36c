import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def ddp_run(tmp_path):
    from tracebuild import make_ddp_run
    return make_ddp_run(tmp_path / "ddp")


@pytest.fixture(scope="module")
def browser():
    """A real headless Chromium, 1400 px wide (browser_helpers.start_chromium; skipped without one)."""
    from browser_helpers import start_chromium
    driver = start_chromium()
    yield driver
    driver.quit()
