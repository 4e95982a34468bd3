"""The real models of polyc's ONNX tests and benchmarks (exported by ``export.py``, which needs
torch; loading them needs only onnx and numpy).

    from benchmarks.onnx_models import MODELS, load
    model = load("resnet18")          # an onnx.ModelProto with every weight materialised
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: name -> (input name, the input's shape with the symbolic dimensions as None, dtype)
MODELS = {
    "resnet18": ("input", (None, 3, 224, 224)),
    "mobilenet_v2": ("input", (None, 3, 224, 224)),
    "squeezenet1_1": ("input", (None, 3, 224, 224)),
    "efficientnet_b0": ("input", (None, 3, 224, 224)),
    "encoder": ("input", (None, None, 768)),
}
#: The detector (tests/onnx/test_detection_model.py): one image, no batch axis.
DETECTORS = {"fasterrcnn": ("images", (3, 320, 320))}


def load(name: str):
    """``name``'s model with its large initializers made again from their recorded statistics."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(HERE / f"{name}.onnx"))
    for entry in list(model.metadata_props):
        if entry.key != "polyc.light":
            continue
        for record in json.loads(entry.value):
            rng = np.random.default_rng(record["seed"])
            array = (rng.standard_normal(record["shape"]) * record["std"] + record["mean"]).astype(record["dtype"])
            model.graph.initializer.append(numpy_helper.from_array(array, record["name"]))
    kept = [e for e in model.metadata_props if e.key != "polyc.light"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model
