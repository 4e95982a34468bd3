"""Export the models of the ONNX zoo benchmark (:mod:`benchmarks.onnx_zoo`); needs torch.

Run by :mod:`benchmarks.onnx_zoo` with a Python that has torch, torchvision and onnx (a venv of
its own: polyc and its tests never import torch):

    TORCH_PYTHON benchmarks/zoo_export.py --out DIR --batch 1 NAME [NAME ...]

Each model is built with random weights from a fixed seed (torchvision's ``weights=None``),
then every parameter whose elements are all equal (ViT's zero head, ConvNeXt's 1e-6 layer
scales, the normalisations' ones and zeros) and the BatchNorm statistics get random values, so
that no layer is void and a wrong kernel anywhere changes the output; where the output's
deviation on the example is still far from 1 (below 1e-3 or above 1e3), each convolution and
linear layer is rescaled to outputs of unit variance.  It is exported with
``torch.onnx.export`` (TorchScript exporter, opset 17, every shape static) as
``DIR/NAME_bBATCH.onnx``, its example inputs beside it as ``NAME_bBATCH.npz`` (the feeds the
benchmark runs).  One JSON line per model goes to stdout: ``{"model", "batch", "ok"}`` with
``"error"`` where the export failed; a failure does not stop the others.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch
import torchvision

#: Sequence length of the transformers, steps of the recurrent models, samples of the audio model.
SEQUENCE = 128
STEPS = 64
AUDIO_SAMPLES = 16000
VOCABULARY = 8192


def distinct_layers(module: torch.nn.Module) -> None:
    """New random weights for every layer: ``nn.TransformerEncoder`` copies one layer, and the
    exporter would store the copies' equal weights once."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.MultiheadAttention):
            layer._reset_parameters()
        elif hasattr(layer, "reset_parameters"):
            layer.reset_parameters()


class TransformerEncoder(torch.nn.Module):
    """6 layers of ``nn.TransformerEncoderLayer`` (d=512, 8 heads), a key padding mask as input."""

    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(512, 8, dim_feedforward=2048, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
        distinct_layers(self)

    def forward(self, x, padding_mask):
        return self.encoder(x, src_key_padding_mask=padding_mask)


class DecoderOnly(torch.nn.Module):
    """A GPT-style language model: token and position embeddings, 4 pre-LayerNorm layers (d=384,
    6 heads, GELU) with a causal mask, a final LayerNorm and the vocabulary's logits."""

    def __init__(self, layers: int = 4, hidden: int = 384, heads: int = 6):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCABULARY, hidden)
        self.positions = torch.nn.Embedding(SEQUENCE, hidden)
        layer = torch.nn.TransformerEncoderLayer(
            hidden, heads, 4 * hidden, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.layers = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, VOCABULARY, bias=False)
        distinct_layers(self)
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(SEQUENCE))

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        x = self.tokens(tokens) + self.positions(positions)
        return self.head(self.norm(self.layers(x, mask=self.causal)))


class BidirectionalGRU(torch.nn.Module):
    """A 2-layer bidirectional GRU (80 features, hidden 256) over 64 steps, a linear classifier
    on every step."""

    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(80, 256, num_layers=2, bidirectional=True, batch_first=True)
        self.classifier = torch.nn.Linear(512, 32)

    def forward(self, x):
        return self.classifier(self.gru(x)[0])


class LSTMLanguageModel(torch.nn.Module):
    """A 2-layer LSTM language model: embedding 256, hidden 512, 64 steps, vocabulary logits."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCABULARY, 256)
        self.lstm = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(512, VOCABULARY)

    def forward(self, tokens):
        return self.head(self.lstm(self.embedding(tokens))[0])


class AudioConv1d(torch.nn.Module):
    """An M5-style raw-waveform classifier: a strided wide Conv1d, then Conv1d stacks with
    BatchNorm, ReLU and max pooling, global average pooling and a linear classifier (35 classes)."""

    def __init__(self):
        super().__init__()
        layers, channels = [], 1
        for width, kernel, stride, pool in ((128, 80, 4, 4), (128, 3, 1, 4), (256, 3, 1, 4), (512, 3, 1, 4)):
            layers += [
                torch.nn.Conv1d(channels, width, kernel, stride=stride, padding=kernel // 2),
                torch.nn.BatchNorm1d(width),
                torch.nn.ReLU(),
                torch.nn.Conv1d(width, width, 3, padding=1),
                torch.nn.BatchNorm1d(width),
                torch.nn.ReLU(),
                torch.nn.MaxPool1d(pool),
            ]
            channels = width
        self.features = torch.nn.Sequential(*layers)
        self.classifier = torch.nn.Linear(channels, 35)

    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=-1))


class OutputOnly(torch.nn.Module):
    """A segmentation model whose forward returns a dict: its ``"out"`` tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def image(size: int = 224):
    return lambda batch: {"input": torch.randn(batch, 3, size, size)}


def tokens(length: int):
    return lambda batch: {"tokens": torch.randint(0, VOCABULARY, (batch, length))}


def encoder_inputs(batch: int) -> dict:
    """Embeddings, and a padding mask that hides the last 8 * (b + 1) % 64 positions of sequence b."""
    mask = torch.zeros(batch, SEQUENCE, dtype=torch.bool)
    for b in range(batch):
        padded = 8 * (b + 1) % 64
        if padded:
            mask[b, SEQUENCE - padded :] = True
    return {"input": torch.randn(batch, SEQUENCE, 512), "padding_mask": mask}


def classification(name: str, size: int = 224, **options):
    return lambda: getattr(torchvision.models, name)(weights=None, **options), image(size)


#: name -> (a function building the module, a function of the batch giving the named example inputs)
ZOO = {
    "resnet34": classification("resnet34"),
    "resnext50_32x4d": classification("resnext50_32x4d"),
    "wide_resnet50_2": classification("wide_resnet50_2"),
    "regnet_x_800mf": classification("regnet_x_800mf"),
    "densenet169": classification("densenet169"),
    "googlenet": classification("googlenet", aux_logits=False, init_weights=True),
    "inception_v3": classification("inception_v3", 299, aux_logits=False, init_weights=True),
    "squeezenet1_0": classification("squeezenet1_0"),
    "shufflenet_v2_x1_0": classification("shufflenet_v2_x1_0"),
    "mnasnet1_0": classification("mnasnet1_0"),
    "mobilenet_v3_large": classification("mobilenet_v3_large"),
    "efficientnet_b1": classification("efficientnet_b1"),
    "efficientnet_v2_s": classification("efficientnet_v2_s"),
    "convnext_small": classification("convnext_small"),
    "swin_t": classification("swin_t"),
    "maxvit_t": classification("maxvit_t"),
    "vit_b_32": classification("vit_b_32"),
    "lraspp_mobilenet_v3_large": (
        lambda: OutputOnly(
            torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)
        ),
        image(),
    ),
    "transformer_encoder": (TransformerEncoder, encoder_inputs),
    "decoder_only": (DecoderOnly, tokens(SEQUENCE)),
    "gru_bidirectional": (BidirectionalGRU, lambda batch: {"input": torch.randn(batch, STEPS, 80)}),
    "lstm_lm": (LSTMLanguageModel, tokens(STEPS)),
    "audio_conv1d": (AudioConv1d, lambda batch: {"input": torch.randn(batch, 1, AUDIO_SAMPLES)}),
}


def no_void_layers(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Random values for every parameter whose elements are all equal, and for the BatchNorm
    running statistics: a weight matrix or kernel gets N(0, 1/fan_in), a scale or shift
    (LayerNorm, BatchNorm, layer scale, bias) its value plus N(0, 0.1), a zero scale N(0, 0.1)
    alone."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.numel() < 2 or not bool((parameter == parameter.flatten()[0]).all()):
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.dim() >= 2 and parameter.shape[0] > 1 and parameter[0].numel() > 1:
                parameter.copy_(noise / math.sqrt(parameter[0].numel()))
            else:
                parameter.add_(0.1 * noise)
        for layer in module.modules():
            if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.running_mean is not None:
                layer.running_mean.copy_(0.1 * torch.randn(layer.running_mean.shape, generator=generator))
                layer.running_var.copy_(0.5 + torch.rand(layer.running_var.shape, generator=generator))


def unit_variance(module: torch.nn.Module, inputs: dict) -> None:
    """Scale each convolution's and linear layer's weights so that its output on ``inputs`` has
    unit variance, in the order the forward pass meets them (as the detector of
    ``onnx_models/export.py``): without it some random initialisations (Inception v3's
    truncated normal of deviation 0.1) grow the activations to 1e13, where the check's atol and
    rtol no longer say whether the values agree."""

    def rescale(layer, _, output):
        scale = output.std().clamp_min(1e-12)
        layer.weight.data /= scale
        if layer.bias is not None:
            layer.bias.data /= scale
        return output / scale

    kinds = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear)
    handles = [layer.register_forward_hook(rescale) for layer in module.modules() if isinstance(layer, kinds)]
    with torch.no_grad():
        module(*inputs.values())
    for handle in handles:
        handle.remove()


#: Outputs whose deviation on the example lies outside these bounds get :func:`unit_variance`.
SANE_DEVIATION = (1e-3, 1e3)


def export(name: str, batch: int, out: Path, seed: int) -> None:
    build, make_inputs = ZOO[name]
    torch.manual_seed(seed)
    module = build().eval()
    no_void_layers(module, torch.Generator().manual_seed(seed + 1))
    torch.manual_seed(seed + 2)
    calibration = make_inputs(1)  # the same at every batch, so every batch gets the same weights
    with torch.no_grad():
        deviation = float(module(*calibration.values()).std())
    if not SANE_DEVIATION[0] <= deviation <= SANE_DEVIATION[1]:
        unit_variance(module, calibration)
    torch.manual_seed(seed + 3)
    inputs = make_inputs(batch)
    stem = out / f"{name}_b{batch}"
    partial = stem.with_suffix(".partial.onnx")
    torch.onnx.export(
        module,
        tuple(inputs.values()),
        str(partial),
        input_names=list(inputs),
        output_names=["output"],
        opset_version=17,
        dynamo=False,
    )
    np.savez(stem.with_suffix(".npz"), **{key: value.numpy() for key, value in inputs.items()})
    partial.rename(stem.with_suffix(".onnx"))  # last: a model file means a complete export


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--list", action="store_true", help="print the models' names and exit")
    parser.add_argument("models", nargs="*")
    args = parser.parse_args(argv)
    if args.list:
        print(",".join(ZOO))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    # The attention fast path is a fused operator the exporter cannot write: the plain one.
    torch.backends.mha.set_fastpath_enabled(False)
    for name in args.models:
        result = {"model": name, "batch": args.batch}
        try:
            if name not in ZOO:
                raise KeyError(f"no zoo model named {name!r}")
            export(name, args.batch, args.out, seed=zlib.crc32(name.encode()) % 100_000)
            result["ok"] = True
        except Exception as error:  # one model's failure is recorded, the others still export
            traceback.print_exc(file=sys.stderr)
            result.update(ok=False, error=f"{type(error).__name__}: {str(error)[:300]}")
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
