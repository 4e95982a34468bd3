"""Suite-wide pytest settings: only the ``--update-goldens`` option, which golden tests read
through the ``update_goldens`` fixture (see tests/test_golden.py)."""
from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the stored golden files under tests/golden/ with the current output "
                          "instead of comparing against them (review the git diff afterwards)")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when pytest ran with ``--update-goldens``: golden tests then write, not compare."""
    return request.config.getoption("--update-goldens")
