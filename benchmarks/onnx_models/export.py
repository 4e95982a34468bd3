"""Export the real models of polyc's ONNX tests and benchmarks, and make them light.

Run by hand, in a venv of its own with torch (never needed by the tests):

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript
    /tmp/torchenv/bin/python benchmarks/onnx_models/export.py [NAME ...]   # all, or the models named

Each model is built with random weights (``weights=None``), exported with ``torch.onnx.export``
(opset 17; the batch, and the image size or the sequence length, symbolic; the detector takes
one image of 3 x 320 x 320), and
written as ``NAME.onnx`` in this directory *without* its large initializers: each of those is
replaced by a line in the model's ``polyc.light`` metadata (name, shape, dtype, mean, standard
deviation and a seed), from which :func:`benchmarks.onnx_models.load` makes it again with numpy,
so onnxruntime and polyc see the same weights and the repository holds a few hundred KB.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import torch
import torchvision
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
#: Initializers with more elements than this are stored as statistics and a seed.
LIGHT_ABOVE = 256


class EncoderLayer(torch.nn.Module):
    """One BERT layer: multi-head self-attention and a GELU feed-forward, each with a residual
    and a post-LayerNorm.  Written out (not nn.TransformerEncoderLayer, whose export bakes the
    example's sequence length into its reshapes), so batch and sequence stay symbolic."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head = heads, hidden // heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm1, self.norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.up, self.down = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        batch, sequence, hidden = x.shape
        q, k, v = self.qkv(x).reshape(batch, sequence, 3, self.heads, self.head).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-1, -2)) / (self.head**0.5)
        attended = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(batch, sequence, hidden)
        x = self.norm1(x + self.out(attended))
        return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Encoder(torch.nn.Module):
    """A BERT-style encoder: 2 layers of hidden 768 and 12 heads, on embeddings."""

    def __init__(self, layers: int = 2, hidden: int = 768, heads: int = 12):
        super().__init__()
        self.layers = torch.nn.ModuleList(EncoderLayer(hidden, heads) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def models():
    yield "resnet18", torchvision.models.resnet18(weights=None), (1, 3, 224, 224), {0: "batch", 2: "height", 3: "width"}
    yield (
        "mobilenet_v2",
        torchvision.models.mobilenet_v2(weights=None),
        (1, 3, 224, 224),
        {0: "batch", 2: "height", 3: "width"},
    )
    yield (
        "squeezenet1_1",
        torchvision.models.squeezenet1_1(weights=None),
        (1, 3, 224, 224),
        {0: "batch", 2: "height", 3: "width"},
    )
    yield (
        "efficientnet_b0",
        torchvision.models.efficientnet_b0(weights=None),
        (1, 3, 224, 224),
        {0: "batch", 2: "height", 3: "width"},
    )
    yield "encoder", Encoder(), (1, 128, 768), {0: "batch", 1: "sequence"}


def unit_variance(module, example, layers) -> None:
    """Scale each of ``layers``' weights so that its output on ``example`` has unit variance,
    in the order the forward pass meets them: torchvision's random initialisation leaves a
    detector's deep features near 1e-8, where every class score ties."""

    def rescale(layer, _, output):
        scale = output.std().clamp_min(1e-12)
        layer.weight.data /= scale
        if layer.bias is not None:
            layer.bias.data /= scale
        return output / scale

    handles = [layer.register_forward_hook(rescale) for layer in layers]
    with torch.no_grad():
        module([example])
    for handle in handles:
        handle.remove()


def detector():
    """torchvision's Faster R-CNN (MobileNetV3-Large 320 FPN) with random weights, rescaled so
    that its scores differ, keeping up to 50 detections above torchvision's 0.05 threshold."""
    from torchvision.models import detection

    model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).eval()
    example = torch.rand(3, 320, 320)
    unit_variance(model, example, [m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d)])
    for parameter in model.roi_heads.box_head.parameters():
        parameter.data.normal_(0, 0.01)
    for parameter in model.roi_heads.box_predictor.cls_score.parameters():
        parameter.data.normal_(0, 0.3)
    model.roi_heads.score_thresh, model.roi_heads.detections_per_img = 0.05, 50
    return model, example


def make_light(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    kept, records = [], []
    for position, tensor in enumerate(model.graph.initializer):
        array = numpy_helper.to_array(tensor)
        if array.size <= LIGHT_ABOVE or array.dtype.kind != "f":
            kept.append(tensor)
            continue
        records.append(
            {
                "name": tensor.name,
                "shape": list(array.shape),
                "dtype": array.dtype.name,
                "mean": float(array.mean()),
                "std": float(array.std()),
                "seed": seed + position,
            }
        )
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = "polyc.light", json.dumps(records)
    return model


def main(names: list[str]) -> None:
    """Export the models named (all when none is)."""
    torch.manual_seed(0)
    for number, (name, module, shape, dynamic) in enumerate(models()):
        if names and name not in names:
            continue
        module.eval()
        path = HERE / f"{name}.full.onnx"
        example = torch.randn(*shape)
        torch.onnx.export(
            module,
            (example,),
            str(path),
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": dynamic, "output": {0: "batch"} if len(shape) == 4 else dynamic},
            opset_version=17,
            dynamo=False,
        )
        model = onnx.load(str(path))
        light = make_light(model, seed=1000 * number)
        onnx.save(light, str(HERE / f"{name}.onnx"))
        path.unlink()
        print(f"{name}: {len(light.graph.node)} nodes, {(HERE / f'{name}.onnx').stat().st_size // 1024} KB")
    if names and "fasterrcnn" not in names:
        return
    # The detector takes a list of images, one here, of a fixed size (its transform resizes).
    torch.manual_seed(0)
    module, example = detector()
    path = HERE / "fasterrcnn.full.onnx"
    torch.onnx.export(
        module,
        ([example],),
        str(path),
        input_names=["images"],
        output_names=["boxes", "labels", "scores"],
        opset_version=17,
        dynamo=False,
    )
    light = make_light(onnx.load(str(path)), seed=9000)
    onnx.save(light, str(HERE / "fasterrcnn.onnx"))
    path.unlink()
    print(f"fasterrcnn: {len(light.graph.node)} nodes, {(HERE / 'fasterrcnn.onnx').stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(sys.argv[1:])
