"""Recognising convolutions: the statements the direct convolution kernel
(:mod:`polyc.codegen.conv`) computes.

A statement is a *convolution* when it has the form (any dimension order in every tensor)::

    O(batch.., group.., f.., x..) +=[!] I(batch.., group.., c.., s*x + d*k + o ..) * W(group.., f.., c.., k..)

Precisely (:func:`recognise_convolution`):

- the update operator is ``+`` (``+=!`` starts from zero, ``+=`` accumulates into the target);
- the right-hand side is the product of two reads, each possibly under a cast that does not
  change the type; target and both operands are float32, or all three float64; neither
  operand is the target;
- every subscript of the target and of the weights ``W`` is a single index, all different;
- every subscript of the image ``I`` is either a single index, or a *window*
  ``s * x + d * k + o``: a target index ``x`` with an integer stride ``s >= 1``, optionally a
  reduction index ``k`` with an integer dilation ``d >= 1``, and an integer offset ``o``; at
  least one subscript of I is a window (else the statement is a contraction, see
  :mod:`polyc.schedule.contraction`), no index appears in two subscripts of I;
- every index of the target and of W ranges over ``[0, extent)`` of each of their dimensions
  it subscripts, and so does every plain index of I (the windows of I stay in bounds by the
  def's bounds check, which every call verifies before it runs);
- every index is in exactly one class, and there is at least one spatial index:

  ========  =============================  =============================================
  class     appears in                     e.g. in ``O(n, g, f, h, w) +=! I(n, g, r_c,
                                           h + r_kh, w + r_kw) * W(g, f, r_c, r_kh, r_kw)``
  ========  =============================  =============================================
  batch     O and I (plain)                n
  group     O, I (plain) and W             g (depthwise: the channel)
  F         O and W                        f (output channels)
  spatial   O, and I in a window           h, w
  C         I (plain) and W (reduced)      r_c (input channels)
  K         I in a window and W (reduced)  r_kh, r_kw
  ========  =============================  =============================================

This covers 1-D, 2-D and 3-D convolutions with any strides, dilations and offsets, grouped
and depthwise convolutions (with or without a channel multiplier), single-channel filters
(``blur(h, w) +=! I(h + r_i, w + r_j) * K(r_i, r_j)``) and any layout (NCHW, NHWC, ...).
*Zero padding* may be written into the statement instead of a padded copy of the image::

    O(n, h, w, f) +=! (h + r_kh >= 1 && h + r_kh < H + 1 && ...) ? I(n, h + r_kh - 1, w + r_kw - 1, r_c) * W(r_kh, r_kw, r_c, f) : 0

when the condition is a conjunction of affine comparisons each of which bounds one window of
the image (``box``: the positions of each window dimension whose products count), the
output channels are the target's innermost dimension and the weights' kernel dimensions come
before their channels (the kernel's channel mode, which pads a copy of the image itself, and
for each tile of points computes each kernel tap only for the points that read it inside the
box), or the convolution is depthwise in a channels-last layout (:func:`depthwise_channels_last`,
:mod:`polyc.codegen.depthwise`, which skips the taps outside the box).  Anything else (a window with two spatial or two kernel indices, a reduction index
only in W, a diagonal, a third factor, ``min=``, integers, other conditions) is not a
convolution: the functions return None and the generic polyhedral path compiles the statement.
A 1x1 convolution has no window; it is a contraction, which the gemm kernel takes.

:func:`recognise_conv_def` accepts a whole def: one convolution into an output, followed
optionally by *epilogue* statements that update the same target element by element (bias,
activation), as in ``O(n, f, h, w) = fmax(O(n, f, h, w) + B(f), 0)``; the check is the one the
gemm kernel uses (:func:`polyc.schedule.patterns.is_epilogue`).

    >>> from polyc.lang.sema import check_source
    >>> d = check_source('''def conv(float(N, C, H, W) I, float(F, C, KH, KW) W1) -> (O) {
    ...     O(n, f, h, w) +=! I(n, r_c, 2 * h + r_kh, 2 * w + r_kw) * W1(f, r_c, r_kh, r_kw) }''')[0]
    >>> c = recognise_convolution(d.statements[0], d)
    >>> c.batch, c.f, c.spatial, c.channels, c.kernel
    (('n',), ('f',), ('h', 'w'), ('r_c',), ('r_kh', 'r_kw'))
    >>> [(w.x, w.stride, w.k, w.dilation) for w in c.windows]
    [('h', 2, 'r_kh', 1), ('w', 2, 'r_kw', 1)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polyc.lang import checked as ir
from polyc.lang.symbolic import Affine
from polyc.schedule.patterns import KERNEL_DTYPES, guarded_product, is_epilogue, two_factors


@dataclass(frozen=True)
class Window:
    """Dimension ``dim`` of the image is subscripted by ``stride * x + dilation * k + offset``
    (``k`` None: no kernel index, ``dilation`` then 0)."""

    dim: int
    x: str
    stride: int
    k: str | None
    dilation: int
    offset: int


@dataclass(frozen=True)
class Bound:
    """Image positions ``lo <= position < hi`` along dimension ``dim`` count (None: no bound
    on that side); the products of positions outside are zero."""

    dim: int
    lo: Affine | None
    hi: Affine | None


@dataclass(frozen=True)
class Convolution:
    """A statement recognised as a convolution (see the module doc).

    ``target`` and ``weights`` give each tensor's index by dimension; ``image_plain`` gives,
    for each dimension of the image subscripted by a single index, that index (None for a
    window dimension), and ``windows`` the window dimensions in image order.  The index
    classes hold index names in target order (``channels`` and ``kernel``: in W's order).
    ``extents`` gives every index's extent (its range is ``[0, extent)``).  ``init`` is the
    statement's ``!``.  ``epilogues`` are the elementwise statements after it on the target.
    ``box``: the zero padding (one :class:`Bound` per bounded window dimension; empty: none).
    """

    statement: ir.CheckedStatement
    target: str
    target_indices: tuple[str, ...]
    image: str
    image_plain: tuple[str | None, ...]
    windows: tuple[Window, ...]
    weights: str
    weight_indices: tuple[str, ...]
    batch: tuple[str, ...]
    groups: tuple[str, ...]
    f: tuple[str, ...]
    spatial: tuple[str, ...]
    channels: tuple[str, ...]
    kernel: tuple[str, ...]
    extents: tuple[tuple[str, Affine], ...]
    dtype: np.dtype
    init: bool
    epilogues: tuple[ir.CheckedStatement, ...] = ()
    box: tuple[Bound, ...] = ()

    def extent(self, index: str) -> Affine:
        return dict(self.extents)[index]

    def window_of(self, x: str) -> Window:
        return next(w for w in self.windows if w.x == x)

    def describe(self) -> str:
        """One line: the index classes and the windows, e.g.
        ``O = I * W1: batch=(n) group=() F=(f) spatial=(h, w) C=(r_c) K=(r_kh, r_kw); windows h:1*h+1*r_kh ...``."""
        groups = [
            ("batch", self.batch),
            ("group", self.groups),
            ("F", self.f),
            ("spatial", self.spatial),
            ("C", self.channels),
            ("K", self.kernel),
        ]
        text = " ".join(f"{name}=({', '.join(indices)})" for name, indices in groups)
        windows = " ".join(
            f"{w.stride}*{w.x}" + (f"+{w.dilation}*{w.k}" if w.k else "") + (f"{w.offset:+d}" if w.offset else "")
            for w in self.windows
        )
        padding = " ".join(
            f"{b.dim}:[{'' if b.lo is None else b.lo}, {'' if b.hi is None else b.hi})" for b in self.box
        )
        return (
            f"{self.target} {'=' if self.init else '+='} {self.image} (*) {self.weights}: {text}; "
            f"windows {windows}"
            + (f"; zero padding outside {padding}" if padding else "")
            + (f"; {len(self.epilogues)} epilogue statement(s)" if self.epilogues else "")
        )


def recognise_conv_def(definition: ir.CheckedDef) -> Convolution | None:
    """The def as one convolution into an output plus elementwise epilogues on it, or None."""
    if not definition.statements:
        return None
    conv = recognise_convolution(definition.statements[0], definition)
    if conv is None or definition.tensor(conv.target).role is not ir.Role.OUTPUT:
        return None
    epilogues = definition.statements[1:]
    extents = dict(conv.extents)
    if not all(is_epilogue(s, conv.target, conv.target_indices, extents, definition) for s in epilogues):
        return None
    return Convolution(**{**conv.__dict__, "epilogues": tuple(epilogues)})


def recognise_convolution(statement: ir.CheckedStatement, definition: ir.CheckedDef) -> Convolution | None:
    """``statement`` as a :class:`Convolution`, or None when it is not one (see the module doc)."""
    target_tensor = definition.tensor(statement.target)
    dtype = target_tensor.dtype
    if statement.op != "+" or dtype not in KERNEL_DTYPES:
        return None
    guarded = guarded_product(statement.rhs)
    if guarded is None:
        return None
    product, guard = guarded
    factors = two_factors(product, dtype)
    if factors is None or any(f.tensor == statement.target for f in factors):
        return None
    if any(definition.tensor(f.tensor).dtype != dtype for f in factors):
        return None
    parsed = [_image_subscripts(f.subscripts, statement.indices) for f in factors]
    # The image is the factor with windows; the weights have single indices only.
    candidates: list[tuple[int, list[str | Window], tuple[str, ...]]] = []
    for i in (0, 1):
        image_side, weight_side = parsed[i], parsed[1 - i]
        if image_side is None or weight_side is None:
            continue
        single_indices = tuple(p for p in weight_side if isinstance(p, str))
        if any(isinstance(p, Window) for p in image_side) and len(single_indices) == len(weight_side):
            candidates.append((i, image_side, single_indices))
    if len(candidates) != 1:
        return None
    image_position, image_parts, weight_indices = candidates[0]
    image_read, weight_read = factors[image_position], factors[1 - image_position]
    target_indices = statement.indices
    if len(set(target_indices)) != len(target_indices) or len(set(weight_indices)) != len(weight_indices):
        return None

    plain = [p for p in image_parts if isinstance(p, str)]
    windows = [p for p in image_parts if isinstance(p, Window)]
    used_in_image = plain + [w.x for w in windows] + [w.k for w in windows if w.k is not None]
    if len(set(used_in_image)) != len(used_in_image):
        return None  # an index in two subscripts of the image (a diagonal, or one window in another)

    in_o, in_w, in_plain = set(target_indices), set(weight_indices), set(plain)
    xs, ks = {w.x for w in windows}, {w.k for w in windows if w.k is not None}
    reduction = set(statement.reduction_indices)
    if not xs <= in_o or xs & in_w or ks & in_o or not ks <= in_w:
        return None  # a window's x must be a target index only, its k a weight index
    batch = (in_o & in_plain) - in_w
    groups = in_o & in_plain & in_w
    f = (in_o & in_w) - in_plain
    channels = (in_plain & in_w) - in_o
    if in_o != batch | groups | f | xs:
        return None
    if reduction != channels | ks or in_w != groups | f | channels | ks or in_plain != batch | groups | channels:
        return None

    extents = _full_range_extents(
        statement,
        definition,
        [
            (statement.target, target_indices),
            (weight_read.tensor, weight_indices),
            (image_read.tensor, tuple(p if isinstance(p, str) else None for p in image_parts)),
        ],
    )
    if extents is None:
        return None

    def in_order(group: set[str], order: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(i for i in order if i in group)

    conv = Convolution(
        statement=statement,
        target=statement.target,
        target_indices=target_indices,
        image=image_read.tensor,
        image_plain=tuple(p if isinstance(p, str) else None for p in image_parts),
        windows=tuple(windows),
        weights=weight_read.tensor,
        weight_indices=weight_indices,
        batch=in_order(batch, target_indices),
        groups=in_order(groups, target_indices),
        f=in_order(f, target_indices),
        spatial=in_order(xs, target_indices),
        channels=in_order(channels, weight_indices),
        kernel=in_order(ks, weight_indices),
        extents=tuple((i, extents[i]) for i in statement.all_indices),
        dtype=dtype,
        init=statement.init,
    )
    if not guard:
        return conv
    kernel_positions = [weight_indices.index(k) for k in ks]
    channel_positions = [weight_indices.index(c) for c in channels]
    channel_mode = target_indices[-1] in f and max(kernel_positions, default=-1) < min(
        channel_positions, default=len(weight_indices)
    )
    if not channel_mode and not depthwise_channels_last(conv):
        return None  # zero padding is the channel mode's (its reduction the taps of runs of channels) or depthwise
    box = _padding_box(guard, image_read.subscripts, windows, statement.all_indices)
    return None if box is None else Convolution(**{**conv.__dict__, "box": box})


def depthwise_channels_last(conv: Convolution) -> bool:
    """Whether ``conv`` is a 2-D depthwise convolution in a channels-last layout, the form of
    :mod:`polyc.codegen.depthwise`: ``O(batch.., h, w, c) +=! I(batch.., window(h), window(w),
    c) * W(kh, kw, c)`` (the channel the only group index, innermost everywhere; both windows
    with a kernel index)."""
    if conv.f or conv.channels or len(conv.groups) != 1 or len(conv.windows) != 2:
        return False
    (wh, ww), c, batch = conv.windows, conv.groups[0], conv.batch
    return (
        wh.k is not None
        and ww.k is not None
        and conv.target_indices == (*batch, wh.x, ww.x, c)
        and conv.image_plain == (*batch, None, None, c)
        and conv.weight_indices == (wh.k, ww.k, c)
    )


@dataclass(frozen=True)
class PointwiseDepthwise:
    """A def that is a 1 x 1 convolution into a temporary (with elementwise epilogues on it)
    whose only reader is a channels-last depthwise convolution into an output (with its own
    epilogues): an inverted-residual block's expansion and depthwise layers (mobilenet_v2,
    efficientnet), computed by :mod:`polyc.codegen.pointwise_depthwise` without storing the
    temporary.  See :func:`recognise_pointwise_depthwise_def`."""

    pointwise: Convolution
    depthwise: Convolution

    @property
    def temporary(self) -> str:
        return self.pointwise.target

    def describe(self) -> str:
        return f"pointwise {self.pointwise.describe()}; then depthwise {self.depthwise.describe()}"


def recognise_pointwise_depthwise_def(definition: ir.CheckedDef) -> PointwiseDepthwise | None:
    """The def as a :class:`PointwiseDepthwise`, or None.  The statements must be, in order:

    - ``T(batch.., h, w, f) +=! X(batch.., h + r_kh, w + r_kw, r_c) * W1(r_kh, r_kw, r_c, f)``
      with both kernel extents 1 (ONNX's 1 x 1 convolution in the channels-last layout), ``T`` a
      temporary of the image's rows and columns;
    - epilogues on ``T`` (:func:`polyc.schedule.patterns.is_epilogue`) that read, besides
      ``T`` at its own point, only vectors indexed by the channel ``f`` (a bias, a batch
      normalization's scale, an activation's constants): the kernel computes ``T`` one row of
      a block of channels at a time, so nothing else of ``T``'s shape is at hand;
    - a depthwise convolution reading ``T`` as its image (:func:`depthwise_channels_last`)
      into an output, and epilogues on that output.  Nothing else reads ``T``.
    """
    statements = definition.statements
    pointwise = recognise_convolution(statements[0], definition) if statements else None
    if pointwise is None or not _channels_last_pointwise(pointwise, definition):
        return None
    temporary = pointwise.target
    if definition.tensor(temporary).role is not ir.Role.TEMPORARY:
        return None
    extents = dict(pointwise.extents)
    split = next(
        (
            i
            for i in range(1, len(statements))
            if not is_epilogue(statements[i], temporary, pointwise.target_indices, extents, definition)
        ),
        None,
    )
    if split is None or not all(_reads_per_channel(s, pointwise) for s in statements[1:split]):
        return None
    depthwise = recognise_convolution(statements[split], definition)
    if (
        depthwise is None
        or depthwise.image != temporary
        or depthwise.weights == temporary
        or not depthwise_channels_last(depthwise)
        or depthwise.dtype != pointwise.dtype
        or definition.tensor(depthwise.target).role is not ir.Role.OUTPUT
    ):
        return None
    epilogues = statements[split + 1 :]
    if not all(
        is_epilogue(s, depthwise.target, depthwise.target_indices, dict(depthwise.extents), definition)
        for s in epilogues
    ):
        return None  # (an epilogue reading T is not one: T is no input)
    return PointwiseDepthwise(
        Convolution(**{**pointwise.__dict__, "epilogues": tuple(statements[1:split])}),
        Convolution(**{**depthwise.__dict__, "epilogues": tuple(epilogues)}),
    )


def _channels_last_pointwise(conv: Convolution, definition: ir.CheckedDef) -> bool:
    """Whether ``conv`` is ``T(batch.., h, w, f) +=! X(batch.., h + r_kh, w + r_kw, c) *
    W(r_kh, r_kw, c, f)`` with kernel extents 1, unpadded, and X of T's rows and columns."""
    if (
        conv.groups
        or len(conv.f) != 1
        or len(conv.channels) != 1
        or len(conv.windows) != 2
        or conv.box
        or not conv.init
    ):
        return False
    (wh, ww), batch, (f,), (c,) = conv.windows, conv.batch, conv.f, conv.channels
    if any(w.stride != 1 or w.offset != 0 or w.k is None or conv.extent(w.k) != Affine.const(1) for w in conv.windows):
        return False
    image, target = definition.tensor(conv.image).shape, definition.tensor(conv.target).shape
    return (
        conv.target_indices == (*batch, wh.x, ww.x, f)
        and conv.image_plain == (*batch, None, None, c)
        and conv.weight_indices == (wh.k, ww.k, c, f)
        and tuple(image[-3:-1]) == tuple(target[-3:-1])
    )


def _reads_per_channel(statement: ir.CheckedStatement, pointwise: Convolution) -> bool:
    """Whether an epilogue on the pointwise target reads, besides the target, only tensors
    subscripted by its channel alone."""
    channel = Affine.var(statement.indices[pointwise.target_indices.index(pointwise.f[0])])
    return all(
        read.tensor == pointwise.target or tuple(read.subscripts) == (channel,) for read in ir.reads(statement.rhs)
    )


def _padding_box(
    guard: tuple[Affine, ...], subscripts, windows: list[Window], indices: tuple[str, ...]
) -> tuple[Bound, ...] | None:
    """The bounds on the image's window positions that ``guard`` (expressions >= 0) states, or
    None when some expression is not ``+-(a window's subscript) + c`` with ``c`` free of
    ``indices``, or a dimension gets two bounds on one side that do not differ by a constant."""
    lows: dict[int, Affine] = {}
    highs: dict[int, Affine] = {}
    for g in guard:
        for w, sign in ((w, sign) for w in windows for sign in (1, -1)):
            rest = g - subscripts[w.dim] if sign == 1 else g + subscripts[w.dim]
            if not rest.names() & set(indices):
                break
        else:
            return None
        # sign 1: position >= -rest; sign -1: position <= rest, i.e. position < rest + 1
        side, bound, tighter = (lows, -rest, max) if sign == 1 else (highs, rest + Affine.const(1), min)
        if w.dim in side:
            difference = bound - side[w.dim]
            if not difference.is_constant:
                return None
            bound = side[w.dim] + tighter(0, difference.constant)
        side[w.dim] = bound
    return tuple(Bound(dim, lows.get(dim), highs.get(dim)) for dim in sorted(set(lows) | set(highs)))


def _image_subscripts(subscripts, target_indices: tuple[str, ...]) -> list[str | Window] | None:
    """Each subscript as a single index name, or as a :class:`Window` whose ``x`` is a target
    index and whose ``k`` (if any) is not; None when some subscript is neither."""
    parts: list[str | Window] = []
    for dim, s in enumerate(subscripts):
        if not isinstance(s, Affine):
            return None
        terms = [(atom, c) for atom, c in s.terms if isinstance(atom, str) and c >= 1]
        if len(terms) != len(s.terms):
            return None
        if len(terms) == 1 and terms[0][1] == 1 and s.constant == 0:
            parts.append(terms[0][0])
            continue
        xs = [(atom, c) for atom, c in terms if atom in target_indices]
        ks = [(atom, c) for atom, c in terms if atom not in target_indices]
        if len(xs) != 1 or len(ks) > 1:
            return None
        (x, stride), (k, dilation) = xs[0], (ks[0] if ks else (None, 0))
        parts.append(Window(dim, x, stride, k, dilation, s.constant))
    return parts


def _full_range_extents(
    statement: ir.CheckedStatement, definition: ir.CheckedDef, operands: list[tuple[str, tuple[str | None, ...]]]
) -> dict[str, Affine] | None:
    """Each index's extent when its range is ``[0, extent)`` of every dimension it subscripts
    (None entries: dimensions not subscripted by a single index, skipped)."""
    extents: dict[str, Affine] = {}
    ranges = dict(statement.ranges)
    for tensor, indices in operands:
        shape = definition.tensor(tensor).shape
        for index, extent in zip(indices, shape):
            if index is None:
                continue
            if index not in ranges:
                return None  # a size name used as a subscript
            r = ranges[index]
            if r.lo != Affine.const(0) or r.hi != extent:
                return None
            extents[index] = extent
    for index in statement.all_indices:
        if index not in extents:
            r = ranges[index]
            if r.lo != Affine.const(0):
                return None
            extents[index] = r.hi
    return extents
