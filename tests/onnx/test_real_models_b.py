"""Real models against onnxruntime, second half (see real_models.py)."""

import pytest

from tests.onnx.real_models import check_model


@pytest.mark.parametrize("name", ["mobilenet_v2", "encoder"])
def test_model(name):
    check_model(name)
