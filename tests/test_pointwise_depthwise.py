"""The fused 1 x 1 + depthwise convolution kernel (polyc/codegen/pointwise_depthwise.py): which
defs it takes, and its results against numpy on every instruction-set branch, one thread and
two, every way of splitting the work between threads, under AddressSanitizer and UBSan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from builds import builds
from kernels import assert_close
from sanitizers import ISA_FLAG_SETS, assert_clean, checked_lines, run_sanitized

import polyc
from polyc.lang.sema import check_source
from polyc.schedule.convolution import recognise_pointwise_depthwise_def

TESTS_DIR = Path(__file__).resolve().parent
FUSED = "polyc pointwise + depthwise conv kernel"

#: The 1 x 1 convolution's epilogues (TC) and their numpy form.
POINTWISE_EPILOGUES = {
    "relu6": (
        "    T(n, h, w, f) = T(n, h, w, f) + B1(f)\n    T(n, h, w, f) = fmin(fmax(T(n, h, w, f), 0.0), 6.0)\n",
        lambda t, b: np.clip(t + b, 0, 6),
    ),
    "silu": (
        "    T(n, h, w, f) = T(n, h, w, f) + B1(f)\n"  # a sigmoid: the pass over each finished row
        "    T(n, h, w, f) = T(n, h, w, f) / (1.0 + exp(-T(n, h, w, f)))\n",
        lambda t, b: (t + b) / (1 + np.exp(-(t + b))),
    ),
    "silu_product": (
        "    T(n, h, w, f) = T(n, h, w, f) + B1(f)\n"  # ONNX's Sigmoid and Mul: in registers
        "    T(n, h, w, f) = T(n, h, w, f) * (1 / (1 + exp(-T(n, h, w, f))))\n",
        lambda t, b: (t + b) / (1 + np.exp(-(t + b))),
    ),
    None: ("", lambda t, b: t),
}


def block(n, h, w, c, e, kernel=3, stride=1, dilation=1, pad=1, epilogue="relu6", dtype="float", op="+=!"):
    """An inverted-residual block's expansion and depthwise layers as one def: T = W1 x X (1 x 1)
    with ``epilogue``, then O = the depthwise convolution of T (zero padding ``pad`` in its
    condition) with a bias and Clip (none when ``op`` is ``+=``)."""
    oh, ow = ((size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1 for size in (h, w))
    y, x = (f"{stride} * {o} + {dilation} * {k} - {pad}" for o, k in (("h", "r_kh"), ("w", "r_kw")))
    after = "" if op == "+=" else "    O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B2(c), 0.0), 6.0)\n"
    return f"""def blk({dtype}({n}, {h}, {w}, {c}) X, {dtype}(1, 1, {c}, {e}) W1, {dtype}({e}) B1,
        {dtype}({kernel}, {kernel}, {e}) W2, {dtype}({e}) B2) -> (O) {{
    T(n, h, w, f) +=! X(n, h + r_k0, w + r_k1, r_c) * W1(r_k0, r_k1, r_c, f) where r_k0 in 0:1, r_k1 in 0:1
{POINTWISE_EPILOGUES[epilogue][0]}    O(n, h, w, c) {op} ({y} >= 0 && {x} >= 0 && {y} < {h} && {x} < {w}) ? T(n, {y}, {x}, c) * W2(r_kh, r_kw, c) : 0.0
        where h in 0:{oh}, w in 0:{ow}, r_kh in 0:{kernel}, r_kw in 0:{kernel}
{after}}}"""


def reference(inputs, kernel=3, stride=1, dilation=1, pad=1, epilogue="relu6", initial=None):
    x, w1, b1, w2, b2 = (a.astype(np.float64) for a in inputs)
    t = POINTWISE_EPILOGUES[epilogue][1](np.einsum("nhwc,cf->nhwf", x, w1[0, 0]), b1)
    padded = np.pad(t, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = ((size - dilation * (kernel - 1) - 1) // stride + 1 for size in padded.shape[1:3])
    out = np.zeros((t.shape[0], oh, ow, t.shape[3]))
    for i in range(kernel):
        for j in range(kernel):
            out += (
                padded[
                    :,
                    i * dilation : i * dilation + stride * (oh - 1) + 1 : stride,
                    j * dilation : j * dilation + stride * (ow - 1) + 1 : stride,
                ]
                * w2[i, j]
            )
    return out + initial if initial is not None else np.clip(out + b2, 0, 6)


def inputs_for(rng, n, h, w, c, e, kernel=3, dtype=np.float32):
    shapes = [(n, h, w, c), (1, 1, c, e), (e,), (kernel, kernel, e), (e,)]
    return [rng.uniform(-1, 1, shape).astype(dtype) for shape in shapes]


def checked(source: str):
    return check_source(source)[0]


# ----------------------------------------------------------------------------- recognition
def test_recognises_an_expansion_then_a_depthwise_layer():
    chain = recognise_pointwise_depthwise_def(checked(block(1, 8, 8, 4, 24, stride=2)))
    assert chain is not None and chain.temporary == "T"
    assert len(chain.pointwise.epilogues) == 2 and len(chain.depthwise.epilogues) == 1
    assert chain.depthwise.windows[0].stride == 2 and "then depthwise" in chain.describe()
    assert recognise_pointwise_depthwise_def(checked(block(1, 8, 8, 4, 24, epilogue=None))) is not None


@pytest.mark.parametrize(
    "change",
    [
        ("-> (O)", "-> (O, T)"),  # T is an output: it must be stored
        (
            "    O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B2(c), 0.0), 6.0)",  # T read again after the depthwise layer
            "    O(n, h, w, c) = O(n, h, w, c) + T(n, h, w, c)",
        ),
        (
            "T(n, h, w, f) + B1(f)\n",
            "T(n, h, w, f) + X(n, h, w, 0)\n",
        ),  # an epilogue of T reads more than a channel vector
        ("W1(r_k0, r_k1, r_c, f)", "W1(r_k0, r_k1, f, r_c)"),  # weights (F, C): not the kernel's layout
    ],
    ids=["temporary-is-output", "temporary-read-twice", "epilogue-reads-image", "weights-fc"],
)
def test_rejects_what_the_kernel_does_not_compute(change):
    assert recognise_pointwise_depthwise_def(checked(block(1, 8, 8, 8, 8).replace(*change))) is None


def test_the_tuner_searches_only_the_threads():
    from polyc.tuning.space import space_for

    compiled = polyc.define(block(1, 8, 8, 4, 24)).blk
    space = space_for(compiled.definition, {}, compiled.options)
    assert space.path == "pointwise_depthwise" and {k.name for k in space.knobs} <= {"threads"}


def test_a_dilated_one_tap_kernel_is_still_1x1():
    source = block(1, 8, 8, 4, 16).replace("X(n, h + r_k0, w + r_k1, r_c)", "X(n, h + 2 * r_k0, w + r_k1, r_c)")
    assert recognise_pointwise_depthwise_def(checked(source)) is not None


def test_a_strided_pointwise_layer_is_not_fused():
    source = (
        block(1, 8, 8, 4, 16)
        .replace("X(n, h + r_k0, w + r_k1, r_c)", "X(n, 2 * h + r_k0, w + r_k1, r_c)")
        .replace("float(1, 8, 8, 4) X", "float(1, 16, 8, 4) X")
    )
    assert recognise_pointwise_depthwise_def(checked(source)) is None


# ----------------------------------------------------------------------------- results
#: (N, H, W, C, E, kernel, stride, dilation, pad, epilogue): channels in one partial vector,
#: whole vectors and a tail; strides, a 5 x 5 window, a dilation, pads wider than the window
#: reaches; a batch; rows the register blocks of pixels do not divide.
GEOMETRIES = [
    (1, 16, 16, 16, 96, 3, 2, 1, 1, "relu6"),
    (2, 9, 7, 24, 40, 3, 1, 1, 1, "relu6"),
    (1, 7, 7, 40, 160, 3, 1, 1, 1, "silu"),
    (3, 5, 6, 8, 20, 3, 1, 1, 1, None),
    (1, 10, 9, 5, 7, 5, 2, 1, 2, "silu"),
    (1, 9, 8, 12, 40, 3, 2, 1, 1, "silu_product"),
    (1, 8, 8, 16, 36, 3, 1, 2, 2, "relu6"),
    (1, 4, 5, 3, 24, 3, 1, 1, 3, "relu6"),
]


@builds("native", "avx2", "portable")
def test_against_numpy(cflags):
    """Every geometry on each instruction set (the epilogues in registers, or in a pass over
    each finished row of T); one thread; float64; the depthwise layer accumulating into given
    outputs."""
    rng = np.random.default_rng(41)
    for n, h, w, c, e, kernel, stride, dilation, pad, epilogue in GEOMETRIES:
        geometry = dict(kernel=kernel, stride=stride, dilation=dilation, pad=pad, epilogue=epilogue)
        compiled = polyc.define(block(n, h, w, c, e, **geometry), cflags=cflags).blk
        assert FUSED in compiled.c_source()
        inputs = inputs_for(rng, n, h, w, c, e, kernel)
        assert_close(compiled(*inputs), reference(inputs, **geometry), c + kernel * kernel + 2, np.float32, inputs)
    n, h, w, c, e = 2, 6, 9, 12, 21
    inputs = inputs_for(rng, n, h, w, c, e)
    for options in (dict(parallel=False), dict(vectorize=False)):
        assert_close(
            polyc.define(block(n, h, w, c, e), cflags=cflags, **options).blk(*inputs),
            reference(inputs),
            c + 11,
            np.float32,
            inputs,
        )
    doubles = inputs_for(rng, n, h, w, c, e, dtype=np.float64)
    assert_close(
        polyc.define(block(n, h, w, c, e, dtype="double"), cflags=cflags).blk(*doubles),
        reference(doubles),
        c + 11,
        np.float64,
        doubles,
    )
    initial = rng.uniform(-1, 1, (n, h, w, e)).astype(np.float32)
    accumulating = polyc.define(block(n, h, w, c, e, op="+="), cflags=cflags).blk
    assert FUSED in accumulating.c_source()
    assert_close(
        accumulating(*inputs, outputs=[initial.copy()]), reference(inputs, initial=initial), c + 11, np.float32, inputs
    )


#: The sizes unknown as the C is written: the row's last pixels in a block of as many as are left.
PARAMETRIC = """def blk(float(N, H, W, C) X, float(1, 1, C, E) W1, float(E) B1, float(3, 3, E) W2, float(E) B2) -> (O) {
    T(n, h, w, f) +=! X(n, h + r_k0, w + r_k1, r_c) * W1(r_k0, r_k1, r_c, f) where h in 0:H, w in 0:W, r_k0 in 0:1, r_k1 in 0:1
    T(n, h, w, f) = fmin(fmax(T(n, h, w, f) + B1(f), 0.0), 6.0)
    O(n, h, w, c) +=! (h + r_kh >= 1 && w + r_kw >= 1 && h + r_kh <= H && w + r_kw <= W)
        ? T(n, h + r_kh - 1, w + r_kw - 1, c) * W2(r_kh, r_kw, c) : 0.0 where h in 0:H, w in 0:W, r_kh in 0:3, r_kw in 0:3
    O(n, h, w, c) = fmin(fmax(O(n, h, w, c) + B2(c), 0.0), 6.0)
}"""


@builds("native", "avx2")
def test_parametric_sizes(cflags):
    rng = np.random.default_rng(44)
    compiled = polyc.define(PARAMETRIC, cflags=cflags, specialize=False).blk
    assert FUSED in compiled.c_source()
    for n, h, w, c, e in ((1, 5, 13, 6, 20), (2, 4, 9, 3, 16), (1, 3, 1, 2, 5), (0, 4, 4, 3, 8), (1, 4, 4, 3, 0)):
        inputs = inputs_for(rng, n, h, w, c, e)
        assert_close(compiled(*inputs), reference(inputs), c + 11, np.float32, inputs)


def test_every_split_between_threads():
    """The threads take work items as they come free: blocks of one image's channel vectors
    (six vectors), bands of its output rows where the blocks are too few (two vectors, one
    vector), whole images of a batch; with 2 to 5 threads, on many calls, so that a race
    between the threads' ring buffers would show."""
    rng = np.random.default_rng(42)
    for n, c, e in ((1, 16, 96), (1, 8, 20), (1, 4, 7), (3, 8, 40), (9, 4, 20)):
        inputs = inputs_for(rng, n, 24, 24, c, e)
        want = reference(inputs)
        for threads in (2, 3, 5):
            compiled = polyc.define(block(n, 24, 24, c, e), threads=threads).blk
            assert FUSED in compiled.c_source()
            for _ in range(8):
                assert_close(compiled(*inputs), want, c + 11, np.float32, inputs)


def test_a_bad_pointwise_epilogue_is_computed_by_the_generic_path():
    """A def the kernel does not take still computes the same (the generic polyhedral path)."""
    rng = np.random.default_rng(43)
    source = block(1, 6, 6, 4, 8).replace("-> (O)", "-> (O, T)")
    compiled = polyc.define(source).blk
    assert FUSED not in compiled.c_source()
    inputs = inputs_for(rng, 1, 6, 6, 4, 8)
    out, _ = compiled(*inputs)
    assert_close(out, reference(inputs), 15, np.float32, inputs)


# ----------------------------------------------------------------------------- sanitizers
_SANITIZED_SCRIPT = """
import sys
import numpy as np
import polyc
sys.path.insert(0, sys.argv[1])
from kernels import assert_close
from test_pointwise_depthwise import FUSED, GEOMETRIES, block, inputs_for, reference
rng = np.random.default_rng(0)
for flags in sys.argv[2:]:
    # a batch and a partial vector, the pass over T's rows, a 5 x 5 window, the logistic
    # function in registers, pads wider than the window reaches, and an image split between
    # threads by rows
    for n, h, w, c, e, kernel, stride, dilation, pad, epilogue in [GEOMETRIES[i] for i in (1, 2, 4, 5, 7)] + [
            (1, 24, 24, 8, 20, 3, 1, 1, 1, "relu6")]:
        geometry = dict(kernel=kernel, stride=stride, dilation=dilation, pad=pad, epilogue=epilogue)
        compiled = polyc.define(block(n, h, w, c, e, **geometry), cflags=flags).blk
        assert FUSED in compiled.c_source()
        inputs = inputs_for(rng, n, h, w, c, e, kernel)
        assert_close(compiled(*inputs), reference(inputs, **geometry), c + kernel * kernel + 2, np.float32, inputs)
    print("checked", flags.split()[-1], flush=True)
"""


def test_sanitized(tmp_path):
    result = run_sanitized(
        _SANITIZED_SCRIPT, str(TESTS_DIR), *ISA_FLAG_SETS, cache_dir=tmp_path, timeout=900, build_first=True
    )
    assert_clean(result)
    assert result.stdout.split() == checked_lines(ISA_FLAG_SETS), result.stdout
