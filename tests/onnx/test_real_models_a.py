"""Real models against onnxruntime, first half (see real_models.py)."""

import pytest

from tests.onnx.real_models import check_model


@pytest.mark.parametrize("name", ["resnet18", "squeezenet1_1", "efficientnet_b0"])
def test_model(name):
    check_model(name)
