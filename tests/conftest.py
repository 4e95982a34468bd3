"""Suite-wide pytest settings: the ``--update-goldens`` option, which golden tests read through
the ``update_goldens`` fixture (see tests/test_golden.py), and a private tuning-records file, so
that records the user made with ``polyc.tune`` never change what the tests compile."""
from __future__ import annotations

import os
import tempfile

import pytest

os.environ["POLYC_TUNING_FILE"] = os.path.join(tempfile.mkdtemp(prefix="polyc-test-tuning-"), "records.jsonl")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the stored golden files under tests/golden/ with the current output "
                          "instead of comparing against them (review the git diff afterwards)")


@pytest.fixture
def update_goldens(request: pytest.FixtureRequest) -> bool:
    """True when pytest ran with ``--update-goldens``: golden tests then write, not compare."""
    return request.config.getoption("--update-goldens")
