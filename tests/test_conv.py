"""Convolutions through the direct convolution back end (polyc/schedule/convolution.py,
polyc/codegen/conv.py).

- recognition: which statements are convolutions, how their indices are classified, which
  defs (a convolution plus elementwise epilogues) take the conv path, and what stays generic;
- numbers against numpy references written by hand (the interpreter would share polyc's front
  end and range inference), with TC's tolerance for each kernel's reduction length: 2-D,
  strided, dilated, offset, grouped,
  depthwise, 1-D and 3-D convolutions, NHWC (packed tiles), odd sizes (widths that are not a
  multiple of the vectors, 1-pixel images, a kernel as large as the image), float64, with and
  without epilogues, accumulation into given outputs, empty reductions, every register block
  and write-back mode, AVX-512, AVX2 and portable builds of the same source, one thread and
  several (repeatedly, for races);
- AddressSanitizer/UBSan builds of conv kernels at edge sizes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builds import builds
from kernels import assert_close
from sanitizers import ISA_FLAG_SETS, checked_lines, run_sanitized

import polyc
from polyc.lang.sema import check_source
from polyc.schedule.convolution import recognise_conv_def, recognise_convolution

TESTS_DIR = Path(__file__).resolve().parent


def checked(source: str):
    return check_source(source)[0]


def conv_of(source: str):
    definition = checked(source)
    return recognise_convolution(definition.statements[0], definition)


# ----------------------------------------------------------------------------- sources
CONV2D = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
}"""
CONV_BIAS_RELU = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
    O(n, f, h, w) = fmax(O(n, f, h, w) + B(f), 0)
}"""
STRIDED = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 3 * w + r_kw) * W1(f, r_c, r_kh, r_kw)
}"""
STRIDE_2 = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 2 * w + r_kw) * W1(f, r_c, r_kh, r_kw)
}"""
DILATED = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + 2 * r_kh, w + 3 * r_kw) * W1(f, r_c, r_kh, r_kw)
}"""
STRIDED_DILATED_OFFSET = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, 2 * h + 2 * r_kh + 1, w + 2 * r_kw + 3) * W1(f, r_c, r_kh, r_kw)
        where w in 0:W - 2 * KW - 1
}"""
GROUPED = """def conv(float(N, G, C, H, W) I, float(G, F, C, KH, KW) W1, float(G, F) B) -> (O) {
    O(n, g, f, h, w) +=! I(n, g, r_c, h + r_kh, w + r_kw) * W1(g, f, r_c, r_kh, r_kw)
    O(n, g, f, h, w) = O(n, g, f, h, w) + B(g, f)
}"""
DEPTHWISE = """def conv(float(N, C, H, W) I, float(C, KH, KW) W1) -> (O) {
    O(n, c, h, w) +=! I(n, c, h + r_kh, w + r_kw) * W1(c, r_kh, r_kw)
}"""
DEPTHWISE_MULTIPLIER = """def conv(float(N, C, H, W) I, float(C, M, KH, KW) W1) -> (O) {
    O(n, c, m, h, w) +=! I(n, c, h + r_kh, w + r_kw) * W1(c, m, r_kh, r_kw)
}"""
CONV1D = """def conv(float(N, C, L) I, float(F, C, K) W1, float(F) B) -> (O) {
    O(n, f, l) +=! I(n, r_c, l + r_k) * W1(f, r_c, r_k)
    O(n, f, l) = tanh(O(n, f, l) + B(f))
}"""
CONV3D = """def conv(float(N, C, D, H, W) I, float(F, C, KD, KH, KW) W1) -> (O) {
    O(n, f, d, h, w) +=! I(n, r_c, d + r_kd, h + r_kh, w + r_kw) * W1(f, r_c, r_kd, r_kh, r_kw)
}"""
NHWC = """def conv(float(N, H, W, C) I, float(KH, KW, C, F) W1) -> (O) {
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
}"""
BLUR = """def blur(float(H, W) I, float(KH, KW) K) -> (O) {
    O(h, w) +=! K(r_i, r_j) * I(h + r_i, w + r_j)
}"""
ACCUMULATING = """def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, f, h, w) += I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
}"""

#: source -> (image, weights, batch, group, F, spatial, C, K, windows as (x, stride, k, dilation, offset))
POSITIVE = {
    "conv2d": (
        CONV2D,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "strided": (
        STRIDED,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 2, "r_kh", 1, 0), ("w", 3, "r_kw", 1, 0)],
        ),
    ),
    "dilated": (
        DILATED,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 2, 0), ("w", 1, "r_kw", 3, 0)],
        ),
    ),
    "offset": (
        STRIDED_DILATED_OFFSET,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 2, "r_kh", 2, 1), ("w", 1, "r_kw", 2, 3)],
        ),
    ),
    "grouped": (
        GROUPED,
        (
            "I",
            "W1",
            ("n",),
            ("g",),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "depthwise": (
        DEPTHWISE,
        (
            "I",
            "W1",
            ("n",),
            ("c",),
            (),
            ("h", "w"),
            (),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "depthwise_multiplier": (
        DEPTHWISE_MULTIPLIER,
        (
            "I",
            "W1",
            ("n",),
            ("c",),
            ("m",),
            ("h", "w"),
            (),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "conv1d": (CONV1D, ("I", "W1", ("n",), (), ("f",), ("l",), ("r_c",), ("r_k",), [("l", 1, "r_k", 1, 0)])),
    "conv3d": (
        CONV3D,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("d", "h", "w"),
            ("r_c",),
            ("r_kd", "r_kh", "r_kw"),
            [("d", 1, "r_kd", 1, 0), ("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "nhwc": (
        NHWC,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "blur_weights_first": (
        BLUR,
        ("I", "K", (), (), (), ("h", "w"), (), ("r_i", "r_j"), [("h", 1, "r_i", 1, 0), ("w", 1, "r_j", 1, 0)]),
    ),
    "accumulating": (
        ACCUMULATING,
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "double": (
        CONV2D.replace("float", "double"),
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "same_type_casts": (
        CONV2D.replace("I(n, r_c, h + r_kh, w + r_kw)", "float(I(n, r_c, h + r_kh, w + r_kw))"),
        (
            "I",
            "W1",
            ("n",),
            (),
            ("f",),
            ("h", "w"),
            ("r_c",),
            ("r_kh", "r_kw"),
            [("h", 1, "r_kh", 1, 0), ("w", 1, "r_kw", 1, 0)],
        ),
    ),
    "strided_subsampling_no_kernel": (
        "def f(float(N, C, H, W) I, float(F, C) W1) -> (O) { O(n, f, h, w) +=! I(n, r_c, 2 * h, 2 * w) * W1(f, r_c) }",
        ("I", "W1", ("n",), (), ("f",), ("h", "w"), ("r_c",), (), [("h", 2, None, 0, 0), ("w", 2, None, 0, 0)]),
    ),
}

NEGATIVE = {
    "same_pad_ternary": """def f(float(N, C, H, W) I, float(F, C, 3, 3) W1) -> (O) {
        O(n, f, h, w) +=! W1(f, r_c, r_kh, r_kw) *
            ((h + r_kh - 1 >= 0 && h + r_kh - 1 < H && w + r_kw - 1 >= 0 && w + r_kw - 1 < W)
                ? I(n, r_c, h + r_kh - 1, w + r_kw - 1) : 0)
            where n in 0:N, h in 0:H, w in 0:W }""",
    "conv1x1_is_a_contraction": "def f(float(N, C, H, W) I, float(F, C) W1) -> (O) {"
    " O(n, f, h, w) +=! I(n, r_c, h, w) * W1(f, r_c) }",
    "max_pooling": "def f(float(N, C, H, W) I) -> (O) {"
    " O(n, c, h, w) max=! I(n, c, 2 * h + r_kh, 2 * w + r_kw) where r_kh in 0:2, r_kw in 0:2 }",
    "min_reduction": CONV2D.replace("+=!", "min=!"),
    "int32": CONV2D.replace("float", "int32"),
    "mixed_precision": CONV2D.replace("float(F, C, KH, KW)", "double(F, C, KH, KW)"),
    "float16_inputs": """def f(float16(N, C, H, W) I, float16(F, C, KH, KW) W1) -> (O) {
        O(n, f, h, w) +=! float(I(n, r_c, h + r_kh, w + r_kw)) * float(W1(f, r_c, r_kh, r_kw)) }""",
    "scaled": CONV2D.replace("+=! I(", "+=! 2 * I("),
    "three_factors": """def f(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) S) -> (O) {
        O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw) * S(f) }""",
    "two_kernel_indices_in_a_window": """def f(float(N, H) I, float(A, B) W1) -> (O) {
        O(n, h) +=! I(n, h + r_a + r_b) * W1(r_a, r_b) }""",
    "two_spatial_indices_in_a_window": """def f(float(H) I, float(K) W1) -> (O) {
        O(h, w) +=! I(h + w + r_k) * W1(r_k) where h in 0:4, w in 0:4 }""",
    "spatial_index_in_the_weights": """def f(float(N, H) I, float(H, K) W1) -> (O) {
        O(n, h) +=! I(n, h + r_k) * W1(h, r_k) where h in 0:H-K+1 }""",
    "kernel_index_only_in_the_weights": """def f(float(N, H) I, float(K, J) W1) -> (O) {
        O(n, h) +=! I(n, h + r_k) * W1(r_k, r_j) }""",
    "channel_twice_in_the_image": """def f(float(C, C, H) I, float(F, C, K) W1) -> (O) {
        O(f, h) +=! I(r_c, r_c, h + r_k) * W1(f, r_c, r_k) }""",
    "offset_range_below_zero": CONV2D.replace("w + r_kw", "w + r_kw + 3"),  # w from -3 by range inference
    "negative_window": """def f(float(H) I, float(K) W1) -> (O) {
        O(h) +=! I(h - r_k + K - 1) * W1(r_k) where h in 0:H-K+1 }""",
    "partial_channels": CONV2D.replace("W1(f, r_c, r_kh, r_kw)", "W1(f, r_c, r_kh, r_kw) where r_c in 0:C/2"),
    "data_dependent": """def f(float(N, H) I, float(K) W1, int32(N) L) -> (O) {
        O(n, h) +=! I(L(n), h + r_k) * W1(r_k) }""",
}


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_recognises_convolutions(name):
    source, (image, weights, batch, groups, f, spatial, channels, kernel, windows) = POSITIVE[name]
    c = conv_of(source)
    assert c is not None, name
    assert (c.image, c.weights, c.batch, c.groups, c.f, c.spatial, c.channels, c.kernel) == (
        image,
        weights,
        batch,
        groups,
        f,
        spatial,
        channels,
        kernel,
    )
    assert [(w.x, w.stride, w.k, w.dilation, w.offset) for w in c.windows] == windows
    assert c.init == (name != "accumulating")
    assert c.describe().startswith("O ")


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_rejects_what_is_not_a_convolution(name):
    definition = checked(NEGATIVE[name])
    assert recognise_convolution(definition.statements[0], definition) is None
    assert recognise_conv_def(definition) is None


def test_def_with_epilogues_is_one_convolution():
    c = recognise_conv_def(checked(CONV_BIAS_RELU))
    assert c is not None and len(c.epilogues) == 1
    assert "1 epilogue statement" in c.describe()
    assert len(recognise_conv_def(checked(GROUPED)).epilogues) == 1


@pytest.mark.parametrize(
    "second",
    [
        "O(n, f, h, w) = O(n, f, h, w) + B(L(f))",  # a data-dependent read
        "P(n, f, h, w) = O(n, f, h, w) * 2",  # writes another tensor
        "O(n, f, h, w) = O(n, f, h, w) + B(f) where h in 0:1",  # part of the target only
        "O(n, f, h, w) = O(n, f, h, w) * float(f) where f in 0:1",  # part of the target only
        "O(n, f, h, w) += B(r_x)",  # a reduction, not element by element
    ],
)
def test_defs_that_are_not_one_convolution(second):
    source = f"""def f(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(F) B, int32(F) L) -> (O) {{
        O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
        {second}
    }}"""
    definition = checked(source)
    assert recognise_convolution(definition.statements[0], definition) is not None
    assert recognise_conv_def(definition) is None


def test_a_convolution_into_a_temporary_is_not_one_kernel():
    source = """def f(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (P) {
        T(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
        P(n, f, h, w) = T(n, f, h, w)
    }"""
    assert recognise_conv_def(checked(source)) is None


SMALL = dict(N=1, C=2, H=5, W=6, F=3, KH=2, KW=3)


def test_stages_and_escape_hatch():
    kernel = polyc.define(CONV_BIAS_RELU).conv
    stages = kernel.stages(SMALL)
    assert stages.convolution is not None and stages.contraction is None
    assert "polyc conv kernel" in stages.kernel.source
    assert stages.optimized_schedule is not None  # still computed, for inspection
    assert kernel.stages(None).convolution is not None  # parametric
    generic = polyc.define(CONV_BIAS_RELU, direct_convolutions=False).conv.stages(SMALL)
    assert generic.convolution is None and "conv kernel" not in generic.kernel.source
    with pytest.raises(polyc.PolycError, match="direct_convolutions"):
        polyc.define(CONV2D, direct_convolutions=1)
    # a 1x1 convolution is a contraction: the gemm kernel takes it first
    conv1x1 = polyc.define(NEGATIVE["conv1x1_is_a_contraction"]).f.stages(dict(N=1, C=2, H=3, W=3, F=2))
    assert conv1x1.contraction is not None and conv1x1.convolution is None
    # the interpreter back end compiles nothing
    assert (
        polyc.define(CONV2D, backend="interpreter").conv(
            np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float32)
        )[0, 0, 0, 0]
        == 4
    )


# ----------------------------------------------------------------------------- numbers
def rand(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, size=shape).astype(dtype)


def numpy_conv2d(image, weights, stride=(1, 1), dilation=(1, 1), offset=(0, 0)):
    """O[n, f, h, w] = sum I[n, c, sh*h + dh*kh + oh, sw*w + dw*kw + ow] * W[f, c, kh, kw], in float64."""
    image, weights = image.astype(np.float64), weights.astype(np.float64)
    n, c, height, width = image.shape
    f, _, kh, kw = weights.shape
    (sh, sw), (dh, dw), (oh, ow) = stride, dilation, offset
    out_h = (height - oh - dh * (kh - 1) - 1) // sh + 1
    out_w = (width - ow - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, f, out_h, out_w))
    for i in range(kh):
        for j in range(kw):
            h0, w0 = oh + dh * i, ow + dw * j
            window = image[:, :, h0 : h0 + sh * (out_h - 1) + 1 : sh, w0 : w0 + sw * (out_w - 1) + 1 : sw]
            out += np.einsum("nchw,fc->nfhw", window, weights[:, :, i, j])
    return out


# (N, C, H, W, F, KH, KW): widths below, at and above the vectors (8, 16, 64, 96 points), not
# multiples of them; a 1-pixel image; a kernel as large as the image; channel counts that are
# not multiples of the register block's rows; enough work for several threads.
CONV2D_SIZES = [
    (1, 1, 1, 1, 1, 1, 1),
    (2, 3, 6, 5, 2, 3, 2),
    (1, 2, 4, 4, 3, 4, 4),
    (2, 3, 9, 17, 5, 3, 3),
    (1, 4, 5, 40, 7, 2, 5),
    (3, 5, 23, 19, 9, 3, 3),
    (2, 16, 30, 33, 13, 3, 3),
    (1, 3, 3, 130, 6, 1, 3),
]


@pytest.mark.parametrize(
    "options",
    [
        {},
        dict(specialize=False),
        dict(parallel=False),
        dict(vectorize=False),
        dict(conv_block=1),
        dict(conv_block=8),
    ],
    ids=["default", "parametric", "serial", "portable", "tiles-1", "tiles-8-4-2"],
)
def test_conv2d_against_numpy(options):
    kernel = polyc.define(CONV2D, **options).conv
    rng = np.random.default_rng(0)
    for n, c, h, w, f, kh, kw in CONV2D_SIZES:
        image, weights = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw))
        assert_close(kernel(image, weights), numpy_conv2d(image, weights), c * kh * kw, np.float32, (image, weights))


def test_strided_dilated_and_offset_windows_against_numpy():
    rng = np.random.default_rng(1)
    cases = [
        (STRIDED, dict(stride=(2, 3))),
        (DILATED, dict(dilation=(2, 3))),
        (STRIDED_DILATED_OFFSET, dict(stride=(2, 1), dilation=(2, 2), offset=(1, 3))),
    ]
    for source, geometry in cases:
        for specialize in (True, False):
            kernel = polyc.define(source, specialize=specialize).conv
            for n, c, h, w, f, kh, kw in [(1, 1, 9, 13, 1, 1, 1), (2, 3, 11, 29, 5, 3, 2), (2, 6, 30, 60, 10, 3, 3)]:
                image, weights = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw))
                expected = numpy_conv2d(image, weights, **geometry)
                assert_close(kernel(image, weights), expected, c * kh * kw, np.float32, (image, weights))


def windows(array, sizes, axes):
    """Every window of ``sizes`` along ``axes`` of ``array`` (float64), window dimensions last."""
    return np.lib.stride_tricks.sliding_window_view(array.astype(np.float64), sizes, axis=axes)


def _grouped(image, weights, bias):
    out = np.einsum("ngchwij,gfcij->ngfhw", windows(image, weights.shape[3:], (3, 4)), weights)
    return out + bias[None, :, :, None, None]


#: source -> (numpy on the inputs, in float64, written without polyc; the reduction length from
#: the weights' shape, plus one for a bias and a few for tanh).
NUMPY_REFERENCES = {
    CONV2D: (lambda I, W: numpy_conv2d(I, W), lambda w: np.prod(w[1:])),
    CONV_BIAS_RELU: (
        lambda I, W, B: np.maximum(numpy_conv2d(I, W) + B[None, :, None, None], 0),
        lambda w: np.prod(w[1:]) + 1,
    ),
    STRIDED: (lambda I, W: numpy_conv2d(I, W, stride=(2, 3)), lambda w: np.prod(w[1:])),
    STRIDE_2: (lambda I, W: numpy_conv2d(I, W, stride=(2, 2)), lambda w: np.prod(w[1:])),
    DILATED: (lambda I, W: numpy_conv2d(I, W, dilation=(2, 3)), lambda w: np.prod(w[1:])),
    STRIDED_DILATED_OFFSET: (
        lambda I, W: numpy_conv2d(I, W, stride=(2, 1), dilation=(2, 2), offset=(1, 3)),
        lambda w: np.prod(w[1:]),
    ),
    GROUPED: (_grouped, lambda w: np.prod(w[2:]) + 1),
    DEPTHWISE: (
        lambda I, W: np.einsum("nchwij,cij->nchw", windows(I, W.shape[1:], (2, 3)), W),
        lambda w: np.prod(w[1:]),
    ),
    DEPTHWISE_MULTIPLIER: (
        lambda I, W: np.einsum("nchwij,cmij->ncmhw", windows(I, W.shape[2:], (2, 3)), W),
        lambda w: np.prod(w[2:]),
    ),
    CONV1D: (
        lambda I, W, B: np.tanh(np.einsum("nclk,fck->nfl", windows(I, W.shape[2:], (2,)), W) + B[None, :, None]),
        lambda w: np.prod(w[1:]) + 4,
    ),
    CONV3D: (
        lambda I, W: np.einsum("ncdhwxyz,fcxyz->nfdhw", windows(I, W.shape[2:], (2, 3, 4)), W),
        lambda w: np.prod(w[1:]),
    ),
    NHWC: (lambda I, W: np.einsum("nhwcij,ijcf->nhwf", windows(I, W.shape[:2], (1, 2)), W), lambda w: np.prod(w[:3])),
    BLUR: (lambda I, K: np.einsum("hwij,ij->hw", windows(I, K.shape, (0, 1)), K), lambda w: np.prod(w)),
    POSITIVE["strided_subsampling_no_kernel"][0]: (
        lambda I, W: np.einsum("nchw,fc->nfhw", I[:, :, ::2, ::2].astype(np.float64), W),
        lambda w: w[1],
    ),
    ACCUMULATING: (lambda I, W, O: O + numpy_conv2d(I, W), lambda w: np.prod(w[1:]) + 1),
}


def numpy_check(source, shapes, options=None, dtype=np.float32, seed=0, outputs=None):
    """The compiled kernel against its numpy reference (NUMPY_REFERENCES) on random inputs of
    ``shapes`` (and ``outputs`` to accumulate into), with TC's tolerance for its reduction."""
    definition = checked(source)
    compiled = polyc.define(source, **(options or {}))[definition.name]
    reference, ops = NUMPY_REFERENCES[source.replace("double", "float")]
    rng = np.random.default_rng(seed)
    inputs = [rand(rng, shape, dtype) for shape in shapes]
    if outputs is None:
        got, want = compiled(*inputs), reference(*inputs)
    else:
        got = compiled(*inputs, outputs=[o.copy() for o in outputs])
        want = reference(*inputs, *(o.astype(np.float64) for o in outputs))
    assert_close(got, want, int(ops(shapes[1])), dtype, inputs)
    return compiled


#: (source, input shapes): every class of convolution, odd sizes.
VARIANTS = {
    "grouped": (
        GROUPED,
        [
            [(2, 3, 4, 7, 9), (3, 5, 4, 3, 3), (3, 5)],
            [(1, 2, 1, 1, 1), (2, 1, 1, 1, 1), (2, 1)],
            [(4, 4, 16, 14, 14), (4, 16, 16, 3, 3), (4, 16)],
        ],
    ),
    "depthwise": (DEPTHWISE, [[(2, 3, 6, 5), (3, 3, 3)], [(1, 2, 2, 4), (2, 2, 1)], [(2, 7, 33, 70), (7, 5, 5)]]),
    "depthwise_multiplier": (DEPTHWISE_MULTIPLIER, [[(2, 3, 8, 21), (3, 2, 3, 3)], [(1, 5, 12, 12), (5, 3, 3, 3)]]),
    "conv1d": (CONV1D, [[(2, 3, 10), (4, 3, 3), (4,)], [(1, 1, 1), (1, 1, 1), (1,)], [(3, 8, 200), (17, 8, 5), (17,)]]),
    "conv3d": (
        CONV3D,
        [[(1, 2, 4, 5, 6), (3, 2, 2, 2, 3)], [(2, 3, 6, 9, 21), (5, 3, 3, 3, 3)], [(1, 1, 2, 2, 2), (1, 1, 2, 2, 2)]],
    ),
    "nhwc": (NHWC, [[(2, 6, 5, 3), (3, 2, 3, 4)], [(1, 20, 21, 8), (3, 3, 8, 20)]]),
    "blur": (BLUR, [[(6, 5), (3, 3)], [(3, 3), (3, 3)], [(40, 100), (5, 5)]]),
    "subsampling": (POSITIVE["strided_subsampling_no_kernel"][0], [[(2, 3, 9, 20), (5, 3)], [(1, 1, 1, 1), (1, 1)]]),
    "offset": (STRIDED_DILATED_OFFSET, [[(2, 3, 12, 21), (5, 3, 2, 3)]]),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("options", [{}, dict(specialize=False, parallel=False)], ids=["default", "parametric-serial"])
def test_variants_against_numpy(name, options):
    source, shape_sets = VARIANTS[name]
    for seed, shapes in enumerate(shape_sets):
        kernel = numpy_check(source, shapes, options, seed=seed)
    assert kernel.stages(None).convolution is not None


def test_register_block_rows_follow_the_output_channels():
    from polyc.codegen.conv import choose_rows

    assert [choose_rows(f) for f in (None, 1, 2, 3, 5, 8, 64)] == [4, 1, 2, 4, 2, 4, 4]
    source = polyc.define(DEPTHWISE).conv.c_source(dict(N=1, C=2, H=5, W=5, KH=3, KW=3))
    assert "1 output channels per register block" in source and "#define POLYC_RF 1" in source


def test_float64_with_epilogue_and_every_block_shape():
    """float64 vectors hold half as many points; channel counts 1, 2, 3, 5 and 8 select every
    register block's row count (1, 2, 4) and leave partial blocks of channels."""
    source = CONV_BIAS_RELU.replace("float", "double")
    for seed, f in enumerate([1, 2, 3, 5, 8]):
        numpy_check(source, [(2, 3, 11, 37), (f, 3, 3, 3), (f,)], dtype=np.float64, seed=seed)
        numpy_check(CONV_BIAS_RELU, [(2, 3, 11, 37), (f, 3, 3, 3), (f,)], seed=seed)


def test_a_residual_of_the_outputs_shape_is_read_at_the_outputs_offset():
    """An epilogue reading a tensor of the target's shape at the target's point (a residual
    block's Add) addresses it like the target, one stream, not through the per-point index
    tables; a residual of another shape (broadcast along a dimension) keeps the tables."""
    residual = """def conv(float(2, 3, 11, 37) I, float(5, 3, 3, 3) W1, float(2, 5, 9, 35) R) -> (O) {
    O(n, f, h, w) +=! I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
    O(n, f, h, w) = fmax(O(n, f, h, w) + R(n, f, h, w), 0)
}"""
    broadcast = residual.replace("float(2, 5, 9, 35) R", "float(1, 5, 9, 35) R").replace(
        "R(n, f, h, w)", "R(0, f, h, w)"
    )
    rng = np.random.default_rng(4)
    image, weights = rand(rng, (2, 3, 11, 37)), rand(rng, (5, 3, 3, 3))
    for source, shape in ((residual, (2, 5, 9, 35)), (broadcast, (1, 5, 9, 35))):
        kernel = polyc.define(source).conv
        assert ("R[polyc_o]" in kernel.c_source({})) == (shape[0] == 2)
        r = rand(rng, shape)
        expected = np.maximum(numpy_conv2d(image, weights) + r, 0)
        assert_close(kernel(image, weights, r), expected, 3 * 9 + 1, np.float32, (image, weights, r))


def test_bias_relu_epilogue_against_numpy():
    kernel = polyc.define(CONV_BIAS_RELU).conv
    rng = np.random.default_rng(2)
    for n, c, h, w, f, kh, kw in CONV2D_SIZES:
        image, weights, bias = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw)), rand(rng, (f,))
        expected = np.maximum(numpy_conv2d(image, weights) + bias[None, :, None, None], 0)
        assert_close(kernel(image, weights, bias), expected, c * kh * kw + 1, np.float32, (image, weights, bias))


def test_accumulation_into_given_outputs():
    rng = np.random.default_rng(3)
    for specialize in (True, False):
        kernel = polyc.define(ACCUMULATING, specialize=specialize).conv
        for n, c, h, w, f, kh, kw in [(1, 1, 1, 1, 1, 1, 1), (2, 3, 9, 17, 5, 3, 3), (2, 8, 20, 40, 12, 3, 3)]:
            image, weights = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw))
            initial = rand(rng, (n, f, h - kh + 1, w - kw + 1))
            out = initial.copy()
            result = kernel(image, weights, outputs=[out])
            assert result is out
            assert_close(out, initial + numpy_conv2d(image, weights), c * kh * kw + 1, np.float32, (image, weights))


def test_accumulation_with_epilogues_and_scalar_input():
    source = """def f(float(N, C, H, W) I, float(F, C, KH, KW) W1, float(N, F) D, float alpha) -> (O) {
        O(n, f, h, w) += I(n, r_c, h + r_kh, w + r_kw) * W1(f, r_c, r_kh, r_kw)
        O(n, f, h, w) += D(n, f)
        O(n, f, h, w) = alpha * O(n, f, h, w) + float(h) - float(w)
    }"""
    definition = checked(source)
    assert recognise_conv_def(definition) is not None
    compiled = polyc.define(source).f
    rng = np.random.default_rng(4)
    for n, c, h, w, f in [(1, 2, 5, 7, 3), (2, 5, 18, 31, 6)]:
        image, weights, d = rand(rng, (n, c, h, w)), rand(rng, (f, c, 3, 3)), rand(rng, (n, f))
        initial = rand(rng, (n, f, h - 2, w - 2))
        got = compiled(image, weights, d, np.float32(1.5), outputs=[initial.copy()])
        rows, columns = np.indices(initial.shape[2:])
        want = 1.5 * (initial + numpy_conv2d(image, weights) + d[:, :, None, None]) + rows - columns
        # the reduction, the starting value, D, alpha's product and the index terms
        assert_close(got, want, c * 9 + 4, np.float32, (image, weights, d, initial))


def test_empty_reductions_and_empty_outputs():
    rng = np.random.default_rng(5)
    kernel = polyc.define(CONV_BIAS_RELU).conv
    bias = rand(rng, (4,))
    out = kernel(np.zeros((2, 0, 5, 6), np.float32), np.zeros((4, 0, 2, 3), np.float32), bias)
    np.testing.assert_array_equal(out, np.broadcast_to(np.maximum(bias, 0)[None, :, None, None], (2, 4, 4, 4)))
    accumulate = polyc.define(ACCUMULATING).conv
    initial = rand(rng, (2, 3, 4, 4))
    out = initial.copy()
    accumulate(np.zeros((2, 0, 5, 6), np.float32), np.zeros((3, 0, 2, 3), np.float32), outputs=[out])
    np.testing.assert_array_equal(out, initial)
    assert polyc.define(CONV2D).conv(np.zeros((0, 2, 5, 5), np.float32), rand(rng, (3, 2, 3, 3))).shape == (0, 3, 3, 3)
    assert polyc.define(CONV2D).conv(rand(rng, (1, 2, 5, 5)), np.zeros((0, 2, 3, 3), np.float32)).shape == (1, 0, 3, 3)


def test_special_values_stay_where_they_belong():
    """Flattened tiles compute on image columns past the output's width (and zero-padded
    weight rows): an inf or NaN there must reach exactly the outputs numpy gives it."""
    rng = np.random.default_rng(6)
    compiled = polyc.define(CONV2D).conv
    for n, c, h, w, f in [(1, 2, 6, 20, 3), (2, 3, 12, 14, 5)]:
        image, weights = rand(rng, (n, c, h, w)), rand(rng, (f, c, 3, 3))
        image[0, 0, 1, w - 1] = np.inf
        image[0, c - 1, h - 1, w - 2] = np.nan
        image[n - 1, 0, 2, 0] = -np.inf
        got, want = compiled(image, weights), numpy_conv2d(image, weights)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
        assert_close(got[finite], want[finite], 9 * c, np.float32, (image[np.isfinite(image)], weights))


@builds("native", "avx2", "portable")
def test_stride_2_along_rows_packs_by_vectors(cflags):
    """Points two image elements apart are packed by vector loads (stepped packing): output
    rows of 7 to 70 points (vectors within a row, across the end of one, at the image's last
    element, and a tile's last partial vector) against numpy, and the C says so."""
    rng = np.random.default_rng(11)
    kernel = polyc.define(STRIDE_2, cflags=cflags, specialize=False).conv
    assert "polyc_pack_stepped(dst + j" in kernel.c_source()
    for n, c, h, w, f, kh, kw in [
        (1, 3, 9, 17, 5, 3, 3),
        (2, 2, 7, 36, 4, 3, 3),
        (1, 3, 12, 143, 8, 7, 7),
        (1, 1, 3, 34, 3, 1, 2),
    ]:
        image, weights = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw))
        expected = numpy_conv2d(image, weights, stride=(2, 2))
        assert_close(kernel(image, weights), expected, c * kh * kw, np.float32, (image, weights))


@builds("avx2", "portable")
def test_every_instruction_set(cflags):
    """The same sources built without AVX-512 (AVX2 kernels, write-back through buffers) and
    without any vector extension."""
    rng = np.random.default_rng(7)
    kernel = polyc.define(CONV_BIAS_RELU, cflags=cflags, specialize=False).conv
    for n, c, h, w, f, kh, kw in CONV2D_SIZES:
        image, weights, bias = rand(rng, (n, c, h, w)), rand(rng, (f, c, kh, kw)), rand(rng, (f,))
        expected = np.maximum(numpy_conv2d(image, weights) + bias[None, :, None, None], 0)
        assert_close(kernel(image, weights, bias), expected, c * kh * kw + 1, np.float32, (image, weights, bias))
    for name in ("grouped", "depthwise", "nhwc", "conv3d"):
        source, shape_sets = VARIANTS[name]
        numpy_check(source, shape_sets[-1], dict(cflags=cflags))
    numpy_check(
        STRIDED.replace("float", "double"), [(2, 3, 11, 29), (5, 3, 3, 2)], dict(cflags=cflags), dtype=np.float64
    )


@builds("native", "portable")
def test_threads_repeatedly(cflags):
    """Work items of every kind (tiles of one image, chunks of channel blocks, packed tiles) on
    several threads, run repeatedly, since a race between threads shows only now and then."""
    rng = np.random.default_rng(8)
    for source, shapes in [
        (CONV_BIAS_RELU, [(1, 8, 20, 30), (37, 8, 3, 3), (37,)]),
        (CONV_BIAS_RELU, [(4, 16, 14, 14), (16, 16, 3, 3), (16,)]),
        (STRIDED, [(2, 8, 30, 61), (21, 8, 3, 3)]),
    ]:
        compiled = polyc.define(source, cflags=cflags).conv
        reference, ops = NUMPY_REFERENCES[source]
        inputs = [rand(rng, shape) for shape in shapes]
        expected = reference(*inputs)
        for _ in range(25):
            assert_close(compiled(*inputs), expected, int(ops(shapes[1])), np.float32, inputs)


def test_tables_kept_for_their_sizes_only():
    """A kernel keeps the tables of its first call's sizes for later calls (see
    ``PatternKernelWriter.kept_tables``): a parametric kernel called with three shapes in turn,
    from four threads at once, each call against numpy (a record used for other sizes, or
    published half built, gives wrong numbers)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(12)
    compiled = polyc.define(CONV_BIAS_RELU, specialize=False).conv
    reference, ops = NUMPY_REFERENCES[CONV_BIAS_RELU]
    cases = []
    for shapes in (
        [(1, 8, 20, 30), (16, 8, 3, 3), (16,)],
        [(2, 3, 9, 41), (5, 3, 1, 1), (5,)],
        [(1, 8, 30, 20), (16, 8, 3, 3), (16,)],
    ):
        inputs = [rand(rng, shape) for shape in shapes]
        cases.append((inputs, reference(*inputs), int(ops(shapes[1]))))

    def run(start: int) -> None:
        for call in range(12):
            inputs, expected, terms = cases[(start + call) % len(cases)]
            assert_close(compiled(*inputs), expected, terms, np.float32, inputs)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(4)))
    assert "polyc_kept" in compiled.c_source()


def test_large_case_matches_numpy_in_parallel():
    """The benchmark's shape at a smaller batch: full tiles, compressed write-back, threads."""
    rng = np.random.default_rng(9)
    image, weights, bias = rand(rng, (2, 64, 56, 56)), rand(rng, (64, 64, 3, 3)), rand(rng, (64,))
    out = polyc.define(CONV_BIAS_RELU).conv(image, weights, bias)
    expected = np.maximum(numpy_conv2d(image, weights) + bias[None, :, None, None], 0)
    assert_close(out, expected, 64 * 9 + 1, np.float32, (image, weights, bias))


# ----------------------------------------------------------------------------- channel mode
# Output channels innermost (NHWC): the kernel vectorises along them (polyc/codegen/conv_channels.py).
NHWC_BIAS_RELU = """def conv(float(N, H, W, C) I, float(KH, KW, C, F) W1, float(F) B) -> (O) {
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
    O(n, h, w, f) = fmax(O(n, h, w, f) + B(f), 0)
}"""
#: Strided and dilated windows, weights in ONNX's (F, C, KH, KW) order: packed per call.
NHWC_STRIDED_OIHW = """def conv(float(N, H, W, C) I, float(F, C, KH, KW) W1) -> (O) {
    O(n, h, w, f) +=! I(n, 2 * h + 2 * r_kh, 3 * w + r_kw, r_c) * W1(f, r_c, r_kh, r_kw)
}"""
NHWC_GROUPED = """def conv(float(N, H, W, G, C) I, float(G, KH, KW, C, F) W1) -> (O) {
    O(n, h, w, g, f) +=! I(n, h + r_kh, w + r_kw, g, r_c) * W1(g, r_kh, r_kw, r_c, f)
}"""
NHWC_ACCUMULATING = NHWC.replace("+=!", "+=")
#: Zero padding of one pixel on every side, written as the statement's condition (as the ONNX
#: front end writes a padded Conv): the kernel pads its own copy of the image and skips the taps
#: of a tile that fall wholly in the padding.  A 1 x 1 kernel makes whole rows of padding.
NHWC_PADDED = """def conv(float(N, H, W, C) I, float(KH, KW, C, F) W1, float(F) B) -> (O) {
    O(n, h, w, f) +=! (h + r_kh >= 1 && h + r_kh < H + 1 && w + r_kw >= 1 && w + r_kw <= W)
        ? I(n, h + r_kh - 1, w + r_kw - 1, r_c) * W1(r_kh, r_kw, r_c, f) : 0
        where h in 0:H + 3 - KH, w in 0:W + 3 - KW, r_kh in 0:KH, r_kw in 0:KW
    O(n, h, w, f) = fmax(O(n, h, w, f) + B(f), 0)
}"""

#: An image model's first layer as the ONNX front end writes it: an NCHW image, stride 2, one
#: pixel of zero padding in the condition, weights (KH, KW, C, F), an NHWC output with its bias
#: and Clip.  Its reduction steps read short runs along the image's rows, one per channel plane
#: and kernel row, which the kernel prefetches for the tile ahead.
FIRST_LAYER = """def conv(float(N, C, H, W) I, float(KH, KW, C, F) W1, float(F) B) -> (O) {
    O(n, h, w, f) +=! (2 * h + r_kh >= 1 && 2 * h + r_kh <= H && 2 * w + r_kw >= 1 && 2 * w + r_kw <= W)
        ? I(n, r_c, 2 * h + r_kh - 1, 2 * w + r_kw - 1) * W1(r_kh, r_kw, r_c, f) : 0
        where h in 0:(H + 2 - KH) / 2 + 1, w in 0:(W + 2 - KW) / 2 + 1, r_kh in 0:KH, r_kw in 0:KW
    O(n, h, w, f) = fmin(fmax(O(n, h, w, f) + B(f), 0), 6)
}"""


def _first_layer_reference(image, weights_kkcf, bias):
    padded = np.pad(image, [(0, 0), (0, 0), (1, 1), (1, 1)])
    out = numpy_conv2d(padded, weights_kkcf.transpose(3, 2, 0, 1), stride=(2, 2)).transpose(0, 2, 3, 1)
    return np.clip(out + bias, 0, 6)


def _nhwc_reference(image, weights_fckk, **geometry):
    """numpy_conv2d on NHWC images, back to NHWC."""
    return numpy_conv2d(image.transpose(0, 3, 1, 2), weights_fckk, **geometry).transpose(0, 2, 3, 1)


def _padded(image, pads):
    """An NHWC image with zeros around: ``pads`` (top, left, bottom, right)."""
    top, left, bottom, right = pads
    return np.pad(image, [(0, 0), (top, bottom), (left, right), (0, 0)])


NUMPY_REFERENCES.update(
    {
        NHWC_BIAS_RELU: (
            lambda I, W, B: np.maximum(_nhwc_reference(I, W.transpose(3, 2, 0, 1)) + B, 0),
            lambda w: np.prod(w[:3]) + 1,
        ),
        NHWC_STRIDED_OIHW: (
            lambda I, W: _nhwc_reference(I, W, stride=(2, 3), dilation=(2, 1)),
            lambda w: np.prod(w[1:]),
        ),
        NHWC_GROUPED: (
            lambda I, W: np.einsum("nhwgcij,gijcf->nhwgf", windows(I, W.shape[1:3], (1, 2)), W),
            lambda w: np.prod(w[1:4]),
        ),
        NHWC_ACCUMULATING: (
            lambda I, W, O: O + _nhwc_reference(I, W.transpose(3, 2, 0, 1)),
            lambda w: np.prod(w[:3]) + 1,
        ),
        NHWC_PADDED: (
            lambda I, W, B: np.maximum(_nhwc_reference(_padded(I, (1, 1, 1, 1)), W.transpose(3, 2, 0, 1)) + B, 0),
            lambda w: np.prod(w[:3]) + 1,
        ),
        FIRST_LAYER: (_first_layer_reference, lambda w: np.prod(w[:3]) + 1),
    }
)

#: (source, input shapes): output channels 1 to 200 (one partial vector, whole blocks, blocks
#: and a tail), images of one pixel to several rows of blocks, a batch that tiles cross, and
#: reductions longer than one chunk of the weights (3 x 3 x 480 steps, every instruction set).
CHANNEL_MODE_CASES = [
    (
        NHWC_BIAS_RELU,
        [
            [(1, 1, 1, 1), (1, 1, 1, 1), (1,)],
            [(2, 5, 7, 3), (3, 2, 3, 20), (20,)],
            [(3, 6, 9, 8), (3, 3, 8, 64), (64,)],
            [(1, 9, 10, 5), (3, 3, 5, 70), (70,)],
            [(2, 4, 5, 16), (1, 2, 16, 200), (200,)],
            [(1, 5, 6, 480), (3, 3, 480, 24), (24,)],
        ],
    ),
    (NHWC_STRIDED_OIHW, [[(2, 11, 20, 3), (17, 3, 3, 2)], [(1, 9, 13, 6), (64, 6, 2, 3)]]),
    (NHWC_GROUPED, [[(2, 5, 6, 3, 4), (3, 3, 3, 4, 18)], [(1, 4, 4, 2, 1), (2, 1, 1, 1, 1)]]),
    # few channels (no taps skipped), taps skipped at 3 x 3, 1 x 1 and 5 x 5, a batch
    (
        NHWC_PADDED,
        [
            [(2, 5, 7, 3), (3, 3, 3, 20), (20,)],
            [(1, 9, 8, 16), (3, 3, 16, 40), (40,)],
            [(2, 4, 6, 17), (1, 1, 17, 9), (9,)],
            [(1, 6, 5, 32), (5, 5, 32, 70), (70,)],
            [(3, 7, 7, 24), (3, 3, 24, 64), (64,)],
        ],
    ),
    # 3 x 3 and 7 x 7 taps on 3 channels (9 and 21 row runs a tile prefetches), odd and even sizes
    (
        FIRST_LAYER,
        [
            [(2, 3, 9, 12), (3, 3, 3, 20), (20,)],
            [(1, 3, 16, 31), (3, 3, 3, 64), (64,)],
            [(1, 3, 20, 17), (7, 7, 3, 32), (32,)],
        ],
    ),
]


@builds("native", "avx2", "portable")
def test_channel_mode_against_numpy(cflags):
    """NHWC convolutions vectorised along their output channels, parametric (one build for
    every size), on every instruction set; float64 too."""
    for source, shape_sets in CHANNEL_MODE_CASES:
        for seed, shapes in enumerate(shape_sets):
            kernel = numpy_check(source, shapes, dict(cflags=cflags, specialize=False), seed=seed)
        assert "output channels vectorised" in kernel.c_source()
    numpy_check(
        NHWC_BIAS_RELU.replace("float", "double"),
        [(2, 5, 7, 3), (3, 2, 3, 20), (20,)],
        dict(cflags=cflags, specialize=False),
        dtype=np.float64,
    )


def test_channel_mode_serial_specialised_tiles_and_accumulation():
    rng = np.random.default_rng(13)
    shapes = [(2, 9, 12, 8), (3, 3, 8, 40), (40,)]
    for options in (dict(parallel=False), {}, dict(conv_block=1), dict(conv_block=50)):
        numpy_check(NHWC_BIAS_RELU, shapes, options)
    initial = rand(rng, (2, 7, 10, 40))
    numpy_check(NHWC_ACCUMULATING, [(2, 9, 12, 8), (3, 3, 8, 40)], outputs=[initial])
    kernel = polyc.define(NHWC_BIAS_RELU).conv
    bias = rand(rng, (5,))
    out = kernel(np.zeros((2, 4, 4, 0), np.float32), np.zeros((3, 3, 0, 5), np.float32), bias)
    np.testing.assert_array_equal(out, np.broadcast_to(np.maximum(bias, 0), (2, 2, 2, 5)))


def _blocked_source(n: int, h: int, w: int, c: int, blocks: int, block: int) -> str:
    """A padded 3 x 3 NHWC convolution whose weights and output are blocked by ``block`` output
    channels, ``(F / block, 3, 3, C, block)`` and ``(N, H, W, F / block, block)``, as the ONNX
    front end writes them (its sizes numbers), with a bias, a residual of the output's shape
    with the channels merged (read by the channel number) and a ReLU."""
    f = blocks * block
    return f"""def conv(float({n}, {h}, {w}, {c}) I, float({blocks}, 3, 3, {c}, {block}) W1, float({f}) B,
                       float({n}, {h}, {w}, {f}) R) -> (O) {{
    O(n, h, w, fb, fi) +=! (h + r_kh >= 1 && h + r_kh <= {h} && w + r_kw >= 1 && w + r_kw <= {w})
        ? I(n, h + r_kh - 1, w + r_kw - 1, r_c) * W1(fb, r_kh, r_kw, r_c, fi) : 0
        where n in 0:{n}, h in 0:{h}, w in 0:{w}, fb in 0:{blocks}, fi in 0:{block}, r_kh in 0:3, r_kw in 0:3
    O(n, h, w, fb, fi) = fmax(O(n, h, w, fb, fi) + B({block} * fb + fi) + R(n, h, w, {block} * fb + fi), 0)
}}"""


def _blocked_reference(I, W, B, R):
    """_blocked_source's result, by numpy, blocked."""
    blocks, _, _, channels, block = W.shape
    filters = W.transpose(0, 4, 3, 1, 2).reshape(blocks * block, channels, 3, 3)
    out = np.maximum(_nhwc_reference(_padded(I, (1, 1, 1, 1)), filters) + B + R, 0)
    return out.reshape(*out.shape[:3], blocks, block)


@builds("native", "avx2")
@pytest.mark.parametrize("block", [64, 24])
def test_channel_mode_with_blocked_weights(block, cflags):
    """Output channels as two indices, a block and a channel in it (the innermost dimensions
    of the output, numbered as one channel): the channel mode, with its epilogue in registers
    (a bias and a residual read by the channel number).  Blocks of 64 channels are a multiple
    of every instruction set's register block, and the kernel reads them in place; blocks of
    24 are not (AVX-512's 3 vectors of 16), and it packs them."""
    for seed, (n, h, w, c, blocks) in enumerate([(1, 7, 7, 32, 3), (2, 5, 6, 16, 2)]):
        source = _blocked_source(n, h, w, c, blocks, block)
        NUMPY_REFERENCES[source] = (_blocked_reference, lambda shape: 9 * shape[3] + 2)
        kernel = numpy_check(
            source,
            [(n, h, w, c), (blocks, 3, 3, c, block), (blocks * block,), (n, h, w, blocks * block)],
            dict(cflags=cflags),
            seed=seed,
        )
        text = kernel.c_source()
        assert "output channels vectorised" in text and "#define POLYC_REGISTER_EPILOGUE 1" in text


def test_half_vector_channel_tails():
    """Output channels whose last vector is at most half full (AVX-512: 8 float or 4 double
    lanes) take the ``_half`` kernels, whose last vector is a 256-bit one: one partial vector,
    a vector and a half, the last of several blocks; padded windows (pieces of masked points),
    accumulation into the output, float64; against numpy.  A channel count with a fuller last
    vector has no such kernel."""
    cases = [
        (NHWC_PADDED, [(2, 5, 7, 3), (3, 3, 3, 24), (24,)], np.float32, 2),
        (NHWC_PADDED, [(1, 6, 5, 16), (3, 3, 16, 8), (8,)], np.float32, 1),
        (NHWC_BIAS_RELU, [(2, 9, 12, 8), (1, 1, 8, 72), (72,)], np.float32, 1),  # blocks of 64, then 8
        (NHWC_BIAS_RELU, [(1, 7, 9, 5), (3, 3, 5, 40), (40,)], np.float32, 3),
        (NHWC_BIAS_RELU.replace("float", "double"), [(2, 6, 7, 3), (1, 2, 3, 12), (12,)], np.float64, 2),
    ]
    for seed, (source, shapes, dtype, vectors) in enumerate(cases):
        kernel = numpy_check(source, shapes, dtype=dtype, seed=seed)
        sizes = dict(zip("NHWC", shapes[0]), KH=shapes[1][0], KW=shapes[1][1], F=shapes[1][3])
        assert f"polyc_convc_kernel_{vectors}_half(" in kernel.c_source(sizes)
    numpy_check(
        NHWC_ACCUMULATING, [(2, 9, 12, 8), (3, 3, 8, 24)], outputs=[rand(np.random.default_rng(3), (2, 7, 10, 24))]
    )
    full = numpy_check(NHWC_BIAS_RELU, [(1, 7, 9, 5), (3, 3, 5, 28), (28,)])
    assert "_half(" not in full.c_source(dict(N=1, H=7, W=9, C=5, KH=3, KW=3, F=28))


@builds("native", "avx2")
def test_register_block_points_follow_the_output_points(cflags):
    """With the sizes known, a register block holds fewer points when the last tile would be
    mostly copies: 49 points (7 x 7, batch 1) in tiles of 5 with 4 vectors of channels (not 9
    tiles of 6), 392 (batch 8) in tiles of 6; parametric, the most the registers hold."""

    def block(batch, **options):
        kernel = numpy_check(
            NHWC_BIAS_RELU, [(batch, 7, 7, 96), (1, 1, 96, 320), (320,)], dict(cflags=cflags, **options), seed=batch
        )
        sizes = dict(N=batch, H=7, W=7, C=96, KH=1, KW=1, F=320) if options.get("specialize", True) else None
        return kernel.c_source(sizes).split('"avx512"')[1].split("#define POLYC_NR ")[1].split()[0]

    assert (block(1), block(8), block(1, specialize=False)) == ("5", "6", "6")


@builds("native", "avx2")
def test_evenly_spaced_points_through_one_pointer(cflags):
    """With the sizes known, tiles whose points are evenly spaced in the image (a row's, at the
    window's stride) take the kernels that read them through one pointer; tiles that cross a
    row or an image, and the last, the general ones: 1 x 1, 3 x 3 and strided windows, few
    output channels (blocks of many points), against numpy."""
    cases = [
        [(2, 9, 13, 32), (1, 1, 32, 16), (16,)],
        [(1, 11, 17, 8), (3, 3, 8, 20), (20,)],
        [(2, 7, 23, 5), (1, 1, 5, 7), (7,)],
    ]
    for shapes in cases:
        kernel = numpy_check(NHWC_BIAS_RELU, shapes, dict(cflags=cflags))
        sizes = dict(zip("NHWC", shapes[0]), KH=shapes[1][0], KW=shapes[1][1], F=shapes[1][3])
        assert "polyc_convc_block_uniform(int64_t nfv" in kernel.c_source(sizes)
    numpy_check(NHWC_STRIDED_OIHW, [(2, 11, 40, 3), (17, 3, 3, 2)], dict(cflags=cflags))


def _padded_windows(h, w, kernel, stride, dilation, pads, product):
    """The output's height and width, and the right-hand side of an NHWC convolution over an
    h x w image with zero padding ``pads`` (top, left, bottom, right) in its condition:
    ``product`` with the image's window subscripts for ``{y}`` and ``{x}``."""
    (kh, kw), (sh, sw), (dh, dw), (top, left, bottom, right) = kernel, stride, dilation, pads
    oh, ow = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1, (w + left + right - dw * (kw - 1) - 1) // sw + 1
    y, x = f"{sh} * h + {dh} * r_kh", f"{sw} * w + {dw} * r_kw"
    inside = (
        [f"{y} >= {top}"] * bool(top)
        + [f"{y} < {h + top}"] * bool(bottom)
        + [f"{x} >= {left}"] * bool(left)
        + [f"{x} < {w + left}"] * bool(right)
    )
    product = product.format(y=f"{y} - {top}", x=f"{x} - {left}")
    return (oh, ow), f"({' && '.join(inside)}) ? {product} : 0" if inside else product


def padded_conv(n, h, w, c, f, kernel, stride, dilation, pads, relu=True):
    """An NHWC convolution with zero padding ``pads`` (top, left, bottom, right) in its condition,
    a bias and a ReLU (or the bias only), at these sizes; and its output's height and width."""
    (kh, kw), (oh, ow), rhs = (
        kernel,
        *_padded_windows(h, w, kernel, stride, dilation, pads, "I(n, {y}, {x}, r_c) * W1(r_kh, r_kw, r_c, f)"),
    )
    return (
        f"""def conv(float({n}, {h}, {w}, {c}) I, float({kh}, {kw}, {c}, {f}) W1, float({f}) B) -> (O) {{
    O(n, h, w, f) +=! {rhs} where h in 0:{oh}, w in 0:{ow}, r_kh in 0:{kh}, r_kw in 0:{kw}
    O(n, h, w, f) = {"fmax(O(n, h, w, f) + B(f), 0)" if relu else "O(n, h, w, f) + B(f)"}
}}""",
        (oh, ow),
    )


#: (N, H, W, C, F, kernel, stride, dilation, pads): asymmetric pads, strides, dilations, a
#: 7 x 7 stride-2 first layer, pads wider than the kernel reaches (rows of outputs that read
#: only padding), images smaller than the kernel.
PADDED_GEOMETRIES = [
    (1, 14, 14, 16, 32, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (2, 7, 9, 24, 70, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 11, 10, 16, 20, (7, 7), (2, 2), (1, 1), (3, 3, 3, 3)),
    (3, 9, 8, 20, 17, (3, 2), (1, 2), (2, 1), (2, 0, 1, 1)),
    (1, 3, 3, 32, 9, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (2, 5, 6, 16, 12, (1, 3), (1, 1), (1, 1), (2, 0, 3, 4)),
]


@builds("native", "avx2", "portable")
def test_zero_padding_in_the_condition_against_numpy(cflags, monkeypatch):
    """Padded convolutions whose kernel pads the image itself and skips the taps a tile reads in
    the padding, against numpy on an explicitly padded image; with reduction chunks of 50 steps
    (runs of taps cut anywhere, chunks a tile skips wholly, first or last), and float64."""
    from polyc.codegen import conv_channels

    rng = np.random.default_rng(21)
    for chunked in (False, True):
        if chunked:  # rchunk = WEIGHT_SLICE_BYTES / (4 bytes * the channels of a work item)
            monkeypatch.setattr(conv_channels, "WEIGHT_SLICE_BYTES", 4 * 50 * 16)
        for n, h, w, c, f, kernel, stride, dilation, pads in PADDED_GEOMETRIES:
            source, _ = padded_conv(n, h, w, c, f, kernel, stride, dilation, pads)
            compiled = polyc.define(source, cflags=cflags, parallel=not chunked).conv
            assert "zero padding outside" in compiled.c_source() and "polyc_conv_pad_rows" in compiled.c_source()
            image, weights, bias = rand(rng, (n, h, w, c)), rand(rng, (*kernel, c, f)), rand(rng, (f,))
            want = np.maximum(
                _nhwc_reference(_padded(image, pads), weights.transpose(3, 2, 0, 1), stride=stride, dilation=dilation)
                + bias,
                0,
            )
            assert_close(
                compiled(image, weights, bias), want, c * kernel[0] * kernel[1] + 1, np.float32, (image, weights, bias)
            )
    source = padded_conv(2, 5, 4, 16, 20, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1))[0].replace("float", "double")
    image, weights, bias = (
        rand(rng, (2, 5, 4, 16), np.float64),
        rand(rng, (3, 3, 16, 20), np.float64),
        rand(rng, (20,), np.float64),
    )
    want = np.maximum(_nhwc_reference(_padded(image, (1, 1, 1, 1)), weights.transpose(3, 2, 0, 1)) + bias, 0)
    assert_close(
        polyc.define(source, cflags=cflags).conv(image, weights, bias),
        want,
        16 * 9 + 1,
        np.float64,
        (image, weights, bias),
    )


@builds("native", "avx2", "portable")
def test_products_in_the_padding_are_not_in_the_sum(cflags):
    """The statement's condition excludes the padding's products from the sum, not merely
    multiplies zeros: with infinite and NaN weights on some taps, the outputs that read those
    taps only in the padding stay finite, bit for bit the interpreter's, in tiles that mix
    rows (the tile's points that read a tap in the padding are not stored by its call)."""
    rng = np.random.default_rng(22)
    for n, h, w, c, f, kernel, stride, dilation, pads in PADDED_GEOMETRIES[:3]:
        source, _ = padded_conv(n, h, w, c, f, kernel, stride, dilation, pads, relu=False)
        image = rng.integers(-3, 4, (n, h, w, c)).astype(np.float32)
        weights = rng.integers(-2, 3, (*kernel, c, f)).astype(np.float32)
        weights[0] = np.inf
        weights[1, 0] = np.nan
        bias = rng.integers(-2, 3, f).astype(np.float32)
        got = polyc.define(source, cflags=cflags).conv(image, weights, bias)
        want = polyc.define(source, backend="interpreter").conv(image, weights, bias)
        assert np.isfinite(want[:, 0, 0]).all() and not np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)
    conv = recognise_conv_def(checked(padded_conv(1, 14, 14, 16, 64, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1))[0]))
    assert [(b.dim, str(b.lo), str(b.hi)) for b in conv.box] == [(1, "0", "14"), (2, "0", "14")]
    assert [w.offset for w in conv.windows] == [-1, -1] and "1:[0, 14) 2:[0, 14)" in conv.describe()


def test_zero_padding_recognition_limits():
    """Padding in the condition is the channel mode's (output channels innermost), on windows
    only, with a zero otherwise."""
    padded = NHWC_PADDED
    assert recognise_conv_def(checked(padded)).box
    nchw = """def conv(float(N, C, H, W) I, float(F, C, 3, 3) W1) -> (O) {
        O(n, f, h, w) +=! (h + r_kh >= 1 && h + r_kh <= H) ? I(n, r_c, h + r_kh - 1, w + r_kw) * W1(f, r_c, r_kh, r_kw) : 0
            where h in 0:H, w in 0:W - 2, r_kh in 0:3 }"""
    on_a_channel = padded.replace("w + r_kw <= W)", "w + r_kw <= W && f < 3)")
    not_zero = padded.replace(": 0\n", ": 1\n")
    not_affine = padded.replace("h + r_kh >= 1 &&", "h * h + r_kh >= 1 &&")
    for source in (nchw, on_a_channel, not_zero):
        assert recognise_conv_def(checked(source)) is None, source
    assert not_affine != padded and recognise_conv_def(checked(not_affine)) is None
    # the generic path computes what the kernel declines, the same numbers
    rng = np.random.default_rng(3)
    inputs = [rand(rng, s) for s in [(1, 5, 6, 16), (3, 3, 16, 4), (4,)]]
    reference, ops = NUMPY_REFERENCES[NHWC_PADDED]
    generic = polyc.define(on_a_channel).conv
    want = reference(*inputs)
    want[..., 3:] = np.maximum(inputs[2][3:], 0)
    assert_close(generic(*inputs), want, int(ops((3, 3, 16, 4))), np.float32, inputs)


#: A channels-last depthwise convolution, "same" zero padding in its condition, bias and relu6.
NHWC_DEPTHWISE = """def conv(float(N, H, W, C) I, float(KH, KW, C) W1, float(C) B) -> (O) {
    O(n, h, w, c) +=! (h + r_kh >= 1 && h + r_kh < H + 1 && w + r_kw >= 1 && w + r_kw <= W)
        ? I(n, h + r_kh - 1, w + r_kw - 1, c) * W1(r_kh, r_kw, c) : 0
        where h in 0:H + 3 - KH, w in 0:W + 3 - KW, r_kh in 0:KH, r_kw in 0:KW
    O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B(c), 0), 6)
}"""


def _depthwise_reference(image, weights, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0)):
    """An NHWC depthwise convolution in float64, with zero padding ``pads`` (top, left, bottom, right)."""
    padded = _padded(image.astype(np.float64), pads)
    (kh, kw, _), (sh, sw), (dh, dw) = weights.shape, stride, dilation
    oh, ow = (padded.shape[1] - dh * (kh - 1) - 1) // sh + 1, (padded.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((image.shape[0], oh, ow, image.shape[3]))
    for i in range(kh):
        for j in range(kw):
            out += (
                padded[:, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                * weights[i, j]
            )
    return out


NUMPY_REFERENCES[NHWC_DEPTHWISE] = (
    lambda I, W, B: np.clip(_depthwise_reference(I, W, pads=(1, 1, 1, 1)) + B, 0, 6),
    lambda w: np.prod(w[:2]) + 1,
)


def padded_depthwise(n, h, w, c, kernel, stride, dilation, pads, epilogue="relu6", op="+=!"):
    """An NHWC depthwise convolution with zero padding ``pads`` in its condition at these sizes,
    then ``epilogue``: "relu6" (a bias, then Clip), "sigmoid" (of the sum plus a bias), "residual"
    (a tensor R of the output's shape added, then ReLU) or None."""
    (kh, kw), (oh, ow), rhs = (
        kernel,
        *_padded_windows(h, w, kernel, stride, dilation, pads, "I(n, {y}, {x}, c) * W1(r_kh, r_kw, c)"),
    )
    extra = {
        "relu6": f", float({c}) B",
        "sigmoid": f", float({c}) B",
        "residual": f", float({n}, {oh}, {ow}, {c}) R",
        None: "",
    }[epilogue]
    after = {
        "relu6": "O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B(c), 0), 6)",
        "sigmoid": "O(n, h, w, c) = 1 / (1 + exp(-(O(n, h, w, c) + B(c))))",
        "residual": "O(n, h, w, c) = fmax(O(n, h, w, c) + R(n, h, w, c), 0)",
        None: "",
    }[epilogue]
    return (
        f"""def conv(float({n}, {h}, {w}, {c}) I, float({kh}, {kw}, {c}) W1{extra}) -> (O) {{
    O(n, h, w, c) {op} {rhs} where h in 0:{oh}, w in 0:{ow}, r_kh in 0:{kh}, r_kw in 0:{kw}
    {after}
}}""",
        (n, oh, ow, c),
    )


def _depthwise_epilogue(epilogue, sums, extra):
    return {
        "relu6": lambda: np.clip(sums + extra, 0, 6),
        "sigmoid": lambda: 1 / (1 + np.exp(-(sums + extra))),
        "residual": lambda: np.maximum(sums + extra, 0),
        None: lambda: sums,
    }[epilogue]()


#: (N, H, W, C, kernel, stride, dilation, pads): channels in one partial vector, whole vectors
#: and a tail; 3 x 3, 5 x 5 (too many weights for the registers) and 3 x 2 windows; strides,
#: dilations, asymmetric pads; pads wider than the window reaches (rows of outputs that read
#: only padding), an image smaller than the window; no padding, a batch.
DEPTHWISE_GEOMETRIES = [
    (1, 9, 11, 20, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (2, 8, 13, 37, (3, 3), (2, 2), (1, 1), (0, 1, 1, 0)),
    (1, 12, 12, 16, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (1, 10, 14, 48, (3, 2), (1, 2), (2, 1), (2, 0, 1, 3)),
    (2, 7, 7, 1, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0)),
    (1, 4, 5, 8, (3, 3), (1, 1), (1, 1), (4, 3, 4, 4)),
    (1, 3, 2, 24, (5, 5), (2, 1), (1, 2), (3, 2, 3, 4)),
    (1, 6, 14, 20, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),  # 10 interior outputs a row: 4, 4 and 2
    # 7 x 7 (ConvNeXt): rows split into blocks of one length, edges under column masks
    (1, 14, 14, 40, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    (1, 7, 7, 16, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    (2, 11, 19, 24, (7, 7), (2, 2), (1, 1), (3, 2, 3, 1)),
]


@builds("native", "avx2", "portable")
def test_depthwise_channels_last_against_numpy(cflags):
    """Channels-last depthwise convolutions get the depthwise kernel, on every instruction set:
    every epilogue form (in registers, or a pass over each finished row), accumulation into
    given outputs, float64, one thread, and sizes unknown when the C is written (the window's
    too: each output then goes alone)."""
    rng = np.random.default_rng(31)
    for geometry, epilogue in zip(
        DEPTHWISE_GEOMETRIES,
        ["relu6", "sigmoid", "residual", "relu6", None, "relu6", "sigmoid", "sigmoid", "residual", None, "relu6"],
        strict=True,
    ):
        source, shape = padded_depthwise(*geometry, epilogue=epilogue)
        compiled = polyc.define(source, cflags=cflags).conv
        assert "polyc depthwise conv kernel" in compiled.c_source({})
        n, h, w, c, kernel, stride, dilation, pads = geometry
        image, weights = rand(rng, (n, h, w, c)), rand(rng, (*kernel, c))
        extra = [] if epilogue is None else [rand(rng, shape if epilogue == "residual" else (c,))]
        want = _depthwise_epilogue(
            epilogue, _depthwise_reference(image, weights, stride, dilation, pads), *(extra or [0])
        )
        assert_close(
            compiled(image, weights, *extra), want, kernel[0] * kernel[1] + 2, np.float32, [image, weights, *extra]
        )
    geometry = DEPTHWISE_GEOMETRIES[1]
    source, shape = padded_depthwise(*geometry, epilogue=None, op="+=")
    image, weights, initial = rand(rng, geometry[:4]), rand(rng, (*geometry[4], geometry[3])), rand(rng, shape)
    for options in (dict(parallel=False), dict(vectorize=False), {}):
        got = polyc.define(source, cflags=cflags, **options).conv(image, weights, outputs=[initial.copy()])
        assert_close(
            got,
            initial + _depthwise_reference(image, weights, *geometry[5:]),
            10,
            np.float32,
            [image, weights, initial],
        )
    for shapes in ([(2, 6, 9, 21), (3, 3, 21), (21,)], [(1, 5, 4, 16), (5, 3, 16), (16,)]):
        compiled = numpy_check(NHWC_DEPTHWISE, shapes, dict(cflags=cflags, specialize=False))
        assert "polyc depthwise conv kernel" in compiled.c_source()
    numpy_check(
        NHWC_DEPTHWISE.replace("float", "double"),
        [(1, 7, 6, 13), (3, 3, 13), (13,)],
        dict(cflags=cflags),
        dtype=np.float64,
    )


@builds("native", "avx2", "portable")
def test_depthwise_products_in_the_padding_are_not_in_the_sum(cflags):
    """With infinite and NaN weights on some taps, the outputs that read those taps only in the
    padding stay finite, bit for bit the interpreter's: the depthwise kernel adds no product
    of the padding, in its blocks of interior outputs or at the edges."""
    rng = np.random.default_rng(32)
    for n, h, w, c, kernel, stride, dilation, pads in DEPTHWISE_GEOMETRIES[:4] + DEPTHWISE_GEOMETRIES[-3:]:
        source, _ = padded_depthwise(n, h, w, c, kernel, stride, dilation, pads, epilogue=None)
        image = rng.integers(-3, 4, (n, h, w, c)).astype(np.float32)
        weights = rng.integers(-2, 3, (*kernel, c)).astype(np.float32)
        weights[0] = np.inf
        weights[1, 0] = np.nan
        got = polyc.define(source, cflags=cflags).conv(image, weights)
        want = polyc.define(source, backend="interpreter").conv(image, weights)
        assert not np.isfinite(want).all()
        np.testing.assert_array_equal(got, want)
    nchw = """def conv(float(N, C, H, W) I, float(C, 3, 3) W1) -> (O) {
        O(n, c, h, w) +=! (h + r_kh >= 1 && h + r_kh <= H) ? I(n, c, h + r_kh - 1, w + r_kw) * W1(c, r_kh, r_kw) : 0
            where h in 0:H, w in 0:W - 2 }"""
    assert recognise_conv_def(checked(NHWC_DEPTHWISE)).box and recognise_conv_def(checked(nchw)) is None


#: Every form the register epilogue covers: a per-channel bias and scale, a residual at the
#: output's point, fmax/fmin against constants and against a tensor (NaN rules), and division.
def nhwc_register_epilogue(n, h, w, c, k, f):
    """Every form the register epilogue covers: a per-channel bias and scale, a residual at the
    output's point, fmax/fmin against constants and against a tensor (NaN rules), division."""
    return f"""def conv(float({n}, {h}, {w}, {c}) I, float({k}, {k}, {c}, {f}) W1, float({f}) B, float({f}) S,
                        float({n}, {h - k + 1}, {w - k + 1}, {f}) R) -> (O) {{
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
    O(n, h, w, f) = fmin(fmax((O(n, h, w, f) + B(f)) * S(f) - R(n, h, w, f), 0.0), 6.0)
    O(n, h, w, f) = fmax(O(n, h, w, f), R(n, h, w, f)) / 2.0
}}"""


@builds("native", "avx2")
def test_channel_mode_epilogue_in_registers(cflags):
    """The vector kernels apply the epilogue to their accumulators before the one store; the
    results equal the scalar epilogue's (the portable build) bit for bit, NaNs, infinities and
    signed zeros included, with tail channels under a lane mask and reductions of several
    chunks (480 x 9 steps).  An epilogue the vector form does not cover (an index value) keeps the scalar pass."""
    rng = np.random.default_rng(15)
    for n, h, w, c, k, f in [(2, 5, 7, 3, 3, 20), (1, 4, 9, 480, 3, 70), (1, 3, 3, 2, 1, 1), (2, 6, 6, 16, 1, 64)]:
        source = nhwc_register_epilogue(n, h, w, c, k, f)
        vector = polyc.define(source, cflags=cflags).conv
        scalar = polyc.define(source, cflags="-O2").conv
        assert "polyc_epilogue_vector(g," in vector.c_source() and "polyc_epilogue(g," in scalar.c_source()
        # Small integers: every sum and product exact, so both builds must agree bit for bit.
        integers = lambda low, high, shape: rng.integers(low, high, shape).astype(np.float32)  # noqa: E731
        image, weights = integers(-3, 4, (n, h, w, c)), integers(-2, 3, (k, k, c, f))
        bias, scale = integers(-20, 21, (f,)), integers(-2, 3, (f,))
        residual = integers(-9, 10, (n, h - k + 1, w - k + 1, f))
        residual.flat[::7] = np.nan
        residual.flat[3::11] = -0.0
        residual.flat[5::13] = np.inf
        bias[::5] = np.nan
        inputs = (image, weights, bias, scale, residual)
        got, want = vector(*inputs), scalar(*inputs)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        conv = np.einsum("nhwcij,ijcf->nhwf", windows(image, (k, k), (1, 2)), weights)
        reference = np.fmin(np.fmax((conv + bias) * scale - residual, 0), 6)
        reference = np.where(np.isnan(residual), reference, np.where(reference >= residual, reference, residual)) / 2
        assert_close(got, reference, c * k * k + 4, np.float32, inputs)
    with_index = NHWC_BIAS_RELU.replace("+ B(f), 0)", "+ B(f) + float(w), 0)")
    assert "polyc_epilogue_vector" not in polyc.define(with_index, cflags=cflags).conv.c_source()


@builds("native", "avx2")
def test_channel_mode_streams_outputs_larger_than_the_last_level_cache(cflags):
    """An output larger than the last-level cache (here one of 64 KiB, by ``cache_sizes``) is
    written with streaming stores where a tile is stored once: whole aligned vectors, the
    tail channels under their mask.  The results equal those of the cached stores bit for
    bit, on an aligned output and on one that is not (every store then takes the cached path),
    and a reduction of several chunks or an accumulation keeps the cached stores."""
    rng = np.random.default_rng(16)
    small_l3 = (32 << 10, 1 << 20, 64 << 10)
    for n, h, w, c, f in [(2, 16, 16, 16, 40), (1, 14, 13, 24, 96), (2, 16, 16, 1100, 40)]:
        source = NHWC_BIAS_RELU
        streaming = polyc.define(source, cflags=cflags, cache_sizes=small_l3).conv
        cached = polyc.define(source, cflags=cflags).conv
        assert "_stream_p" in streaming.c_source()
        integers = lambda low, high, shape: rng.integers(low, high, shape).astype(np.float32)  # noqa: E731
        inputs = (integers(-3, 4, (n, h, w, c)), integers(-2, 3, (1, 1, c, f)), integers(-20, 21, (f,)))
        assert n * h * w * f * 4 > small_l3[2]
        want = cached(*inputs)
        np.testing.assert_array_equal(streaming(*inputs), want)
        for offset in (0, 1):  # an output of polyc's own alignment, and one a float off it
            buffer = np.empty(want.size + 16 + offset, np.float32)
            start = (-buffer.ctypes.data // 4) % 16 + offset
            out = buffer[start : start + want.size].reshape(want.shape)
            streaming(*inputs, outputs=[out])
            np.testing.assert_array_equal(out, want)
        reference = np.maximum(np.einsum("nhwc,cf->nhwf", inputs[0], inputs[1][0, 0]) + inputs[2], 0)
        assert_close(want, reference, c + 1, np.float32, inputs)


def nhwc_select_epilogue(n, h, w, c, f):
    """ONNX's Relu as polyc writes it (a select), then selects on every comparison, against a
    residual R holding NaNs: C's comparisons are false on NaN, but ``!=``."""
    return f"""def conv(float({n}, {h}, {w}, {c}) I, float(1, 1, {c}, {f}) W1, float({f}) B,
                        float({n}, {h}, {w}, {f}) R) -> (O) {{
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
    O(n, h, w, f) = O(n, h, w, f) + B(f)
    O(n, h, w, f) = O(n, h, w, f) > 0 ? O(n, h, w, f) : 0
    O(n, h, w, f) = (O(n, h, w, f) < R(n, h, w, f) ? 1.0 : 0.0) + (O(n, h, w, f) <= R(n, h, w, f) ? 2.0 : 0.0)
                    + (O(n, h, w, f) >= R(n, h, w, f) ? 4.0 : 0.0) + (O(n, h, w, f) == R(n, h, w, f) ? 8.0 : 0.0)
                    + (O(n, h, w, f) != R(n, h, w, f) ? 16.0 : 0.0) + O(n, h, w, f) * 32
}}"""


@builds("native", "avx2")
def test_channel_mode_select_epilogue_in_registers(cflags):
    """Selects on comparisons run on the accumulators (a ReLU, ONNX's, among them) with C's
    answers on NaN: bit for bit the portable build's scalar pass, tail channels masked."""
    rng = np.random.default_rng(17)
    for n, h, w, c, f in [(2, 5, 7, 3, 20), (1, 4, 6, 16, 64)]:
        source = nhwc_select_epilogue(n, h, w, c, f)
        vector = polyc.define(source, cflags=cflags).conv
        scalar = polyc.define(source, cflags="-O2").conv
        assert "polyc_epilogue_vector(g," in vector.c_source() and "polyc_epilogue(g," in scalar.c_source()
        image = rng.integers(-3, 4, (n, h, w, c)).astype(np.float32)
        weights = rng.integers(-2, 3, (1, 1, c, f)).astype(np.float32)
        bias = rng.integers(-4, 5, f).astype(np.float32)
        bias[::7] = np.nan
        residual = rng.integers(-3, 4, (n, h, w, f)).astype(np.float32)
        residual.flat[::5] = np.nan
        inputs = (image, weights, bias, residual)
        got = vector(*inputs)
        np.testing.assert_array_equal(got.view(np.uint32), scalar(*inputs).view(np.uint32))
        x = np.einsum("nhwc,cf->nhwf", image, weights[0, 0]) + bias
        x = np.where(x > 0, x, 0)
        with np.errstate(invalid="ignore"):
            want = (
                (x < residual) * 1.0
                + (x <= residual) * 2.0
                + (x >= residual) * 4.0
                + (x == residual) * 8.0
                + (x != residual) * 16.0
                + x * 32
            )
        np.testing.assert_array_equal(got, want.astype(np.float32))


#: SiLU after a bias, as ONNX's Sigmoid and Mul lower: the logistic quotient the register
#: epilogue computes with polyc_sigmoidf's vector form.
SILU_EPILOGUE = (
    "    O(n, h, w, {i}) = O(n, h, w, {i}) + B({i})\n"
    "    O(n, h, w, {i}) = O(n, h, w, {i}) * (1 / (1 + exp(-O(n, h, w, {i}))))\n"
)


@builds("native", "avx2")
def test_logistic_epilogue_in_registers_is_polyc_sigmoidf_bit_for_bit(cflags):
    """The logistic quotient after a convolution (a full one and a depthwise one) runs on the
    accumulators and gives what polyc_sigmoidf gives in a loop of its own, bit for bit: NaN and
    infinite biases, the clamped ends (|x| > 86), tail channels under a lane mask.  Small
    integer inputs make the sums before it exact.  (The fused 1 x 1 + depthwise pair:
    tests/test_pointwise_depthwise.py.)"""
    rng = np.random.default_rng(18)
    silu = polyc.define("def silu(float(N) X) -> (Y) { Y(i) = X(i) * (1 / (1 + exp(-X(i)))) }", cflags=cflags).silu
    full = f"""def conv(float(N, H, W, C) I, float(3, 3, C, F) W1, float(F) B) -> (O) {{
    O(n, h, w, f) +=! I(n, h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)
{SILU_EPILOGUE.format(i="f")}}}"""
    depthwise = NHWC_DEPTHWISE.replace(
        "    O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B(c), 0), 6)\n", SILU_EPILOGUE.format(i="c")
    )
    integers = lambda low, high, shape: rng.integers(low, high, shape).astype(np.float32)  # noqa: E731
    for source, c in [(full, 3), (depthwise, 20)]:
        kernel = polyc.define(source, cflags=cflags).conv
        assert "polyc_epilogue_vector(g," in kernel.c_source() and "polyc_sigmoid_avx" in kernel.c_source()
        image = integers(-3, 4, (2, 5, 7, c))
        weights = integers(-2, 3, (3, 3, c, 20) if source == full else (3, 3, 20))
        bias = integers(-90, 91, 20) + np.float32(0.375)
        bias[:6] = [np.nan, np.inf, -np.inf, 95.0, -95.0, -0.0]
        if source == full:
            sums = np.einsum("nhwcij,ijcf->nhwf", windows(image, (3, 3), (1, 2)), weights)
        else:
            sums = _depthwise_reference(image, weights, pads=(1, 1, 1, 1)).astype(np.float32)
        want = silu((sums + bias).astype(np.float32).ravel()).reshape(sums.shape)
        got = kernel(image, weights, bias)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@builds("native", "portable")
def test_channel_mode_threads_repeatedly(cflags):
    rng = np.random.default_rng(14)
    compiled = polyc.define(NHWC_BIAS_RELU, cflags=cflags).conv
    reference, ops = NUMPY_REFERENCES[NHWC_BIAS_RELU]
    shapes = [(2, 16, 15, 32), (3, 3, 32, 96), (96,)]
    inputs = [rand(rng, shape) for shape in shapes]
    expected = reference(*inputs)
    for _ in range(25):
        assert_close(compiled(*inputs), expected, int(ops(shapes[1])), np.float32, inputs)


# ----------------------------------------------------------------------------- sanitizers
_SANITIZED_SCRIPT = """
import sys
import numpy as np
import polyc
from kernels import assert_close
sys.path.insert(0, sys.argv[1])
from test_conv import (CONV_BIAS_RELU, STRIDED, STRIDE_2, GROUPED, DEPTHWISE, NHWC, NHWC_BIAS_RELU,
                       NHWC_STRIDED_OIHW, NHWC_PADDED, NHWC_DEPTHWISE, CONV1D, ACCUMULATING, FIRST_LAYER,
                       numpy_check)
rng = np.random.default_rng(0)
for position, flags in enumerate(sys.argv[2:]):
    # parametric kernels (one build for every size); specialised ones with the first flags only
    for specialize in (False, True) if position == 0 else (False,):
        options = dict(cflags=flags, specialize=specialize)
        for shapes in [[(1, 1, 1, 1), (1, 1, 1, 1), (1,)], [(2, 3, 5, 17), (5, 3, 3, 3), (5,)],
                       [(1, 4, 9, 40), (6, 4, 4, 4), (6,)], [(1, 2, 3, 3), (3, 2, 3, 3), (3,)]][specialize * 2:]:
            numpy_check(CONV_BIAS_RELU, shapes, options)
        numpy_check(STRIDED, [(2, 3, 11, 29), (5, 3, 3, 2)], options)
        numpy_check(STRIDE_2, [(1, 2, 7, 36), (3, 2, 3, 3)], options)
        numpy_check(GROUPED, [(2, 3, 4, 7, 9), (3, 5, 4, 3, 3), (3, 5)], options)
        numpy_check(DEPTHWISE, [(2, 3, 6, 35), (3, 3, 3)], options)
        numpy_check(NHWC, [(2, 6, 5, 3), (3, 2, 3, 4)], options)
        numpy_check(NHWC_BIAS_RELU, [(2, 5, 7, 3), (3, 2, 3, 20), (20,)], options)
        numpy_check(NHWC_STRIDED_OIHW, [(2, 11, 20, 3), (17, 3, 3, 2)], options)
        numpy_check(NHWC_PADDED, [(2, 5, 7, 16), (3, 3, 16, 20), (20,)], options)
        # one image: the last tile is partial and its last point, the top-left corner, reads
        # the image's first element; its copies must not read the taps left of it
        numpy_check(NHWC_PADDED, [(1, 5, 7, 16), (3, 3, 16, 20), (20,)], options)
        numpy_check(NHWC_DEPTHWISE, [(2, 5, 9, 21), (3, 3, 21), (21,)], options)
        numpy_check(FIRST_LAYER, [(2, 3, 9, 12), (3, 3, 3, 20), (20,)], options)
        if not specialize:  # the Winograd kernel (specialised only): odd sizes, F not a whole block
            numpy_check(NHWC_PADDED, [(2, 9, 7, 16), (3, 3, 16, 48), (48,)], {**options, "specialize": True, "winograd": True})
            numpy_check(CONV1D, [(2, 3, 37), (4, 3, 3), (4,)], options)
            numpy_check(ACCUMULATING, [(2, 3, 9, 20), (5, 3, 3, 3)], options,
                              outputs=[rng.uniform(-1, 1, (2, 5, 7, 18)).astype(np.float32)])
    print("checked", flags.split()[-1], flush=True)
"""


def test_sanitized_conv_kernels(tmp_path):
    flag_sets = ISA_FLAG_SETS
    result = run_sanitized(
        _SANITIZED_SCRIPT, str(TESTS_DIR), *flag_sets, cache_dir=tmp_path, timeout=900, build_first=True
    )
    report = result.stdout + result.stderr[-5000:]
    assert result.returncode == 0, report
    assert "AddressSanitizer" not in result.stderr and "runtime error" not in result.stderr, report
    assert result.stdout.split() == checked_lines(ISA_FLAG_SETS), report
