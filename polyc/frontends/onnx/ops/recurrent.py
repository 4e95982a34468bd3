"""The recurrent layers, RNN, GRU and LSTM: one kernel per layer and direction whose time loop
is inside it.

- the input projection of every time step at once, ``X W^T + biases``: one contraction;
- the recurrence: a TC ``for s in 0:steps { ... }`` block (docs/language.md, "Recurrences"):
  per step, ``H_prev R^T`` (a reduction reading the state the step before wrote, or the initial
  state at the first step), then the gates and the new state; the states of every step are the
  block's output ``(steps, batch, hidden)``, in step order (a reverse direction's step s reads
  time ``steps - 1 - s``);
- the outputs: ``Y`` gathered from the directions' states in time order, the last states views
  of their last step.

Which lowering, measured at one thread (``python -m benchmarks.onnx_zoo --models lstm_lm,gru_bidirectional``,
``benchmarks/results/zen5_onnx_zoo_subset.json``): with a batch of one the step's products are
matrix-vector products, as fast in the time loop's kernel as in a kernel per step, and the kernel
saves a call, a team and a concatenation per step.  With a larger batch, where each step's
products are contractions of the state with the weights (``_gemm_per_step``), the unrolled step's
contraction kernel reads the weights once for the whole batch and the loop nest once per entry:
the layer is unrolled.  GRU without ``linear_before_reset`` scales the state by the reset gate
inside its product, no contraction kernel takes that step, and the time loop's kernel is the
faster at every batch.

Where the layer is not looped, or the batch entries have different lengths (``sequence_lens``
shorter than the sequence), it is unrolled, one kernel call per time step: every step of a direction is the same
statements on the same shapes, reading its time step's slice of the input projection through a
view, so the steps share one compiled kernel (see ``_canonical_def`` in
:mod:`polyc.frontends.onnx.plan`), and the outputs are the states stacked in time order.

Gate order, activations (with their alpha and beta), clip, peepholes, GRU's
``linear_before_reset``, LSTM's ``input_forget``, the directions and both layouts are ONNX's.
``sequence_lens`` is known when planning (a constant, an input the plan is specialised on, or
learned in a stage): a batch entry shorter than the sequence keeps its states once its steps
are done, reads its steps from its own end in the reverse direction, and has zeros in ``Y``
past its length (and zero final states when empty), as onnxruntime gives them.
"""

from __future__ import annotations

import numpy as np

from polyc.errors import UnsupportedError
from polyc.frontends.onnx.lowering import Builder, Value, indices, tc_type
from polyc.frontends.onnx.ops.base import Converter, _number, _require_const
from polyc.frontends.onnx.ops.shapes import concatenated, transposed

#: Activation -> its TC expression of ``{x}`` and its default alpha and beta (None: takes none).
ACTIVATIONS = {
    "Sigmoid": ("1 / (1 + exp(-({x})))", None, None),
    "Tanh": ("tanh({x})", None, None),
    "Relu": ("fmax({x}, 0)", None, None),
    "Affine": ("{alpha} * ({x}) + {beta}", 1.0, 0.0),
    "LeakyRelu": ("(({x}) >= 0 ? ({x}) : {alpha} * ({x}))", 0.01, None),
    "ThresholdedRelu": ("(({x}) > {alpha} ? ({x}) : 0)", 1.0, None),
    "ScaledTanh": ("{alpha} * tanh({beta} * ({x}))", 1.0, 1.0),
    "HardSigmoid": ("fmax(0, fmin(1, {alpha} * ({x}) + {beta}))", 0.2, 0.5),
    "Elu": ("(({x}) >= 0 ? ({x}) : {alpha} * (exp({x}) - 1))", 1.0, None),
    "Softsign": ("({x}) / (1 + fabs({x}))", None, None),
    "Softplus": ("log(1 + exp({x}))", None, None),
}


def _activations(b: Builder, node, defaults: list[str], directions: int) -> list[list]:
    """Per direction, its activation functions as callables of a TC expression: the node's
    ``activations`` (the defaults for every direction when absent), each taking its alpha and
    beta from ``activation_alpha`` and ``activation_beta`` in turn, as onnxruntime reads them."""
    names = [n.decode() if isinstance(n, bytes) else n for n in (node.attr("activations") or [])]
    names = names or defaults * directions
    if len(names) != len(defaults) * directions:
        raise UnsupportedError(
            f"{b.where}: {len(names)} activations for {directions} direction(s) of {len(defaults)} each"
        )
    alphas, betas = list(node.attr("activation_alpha") or []), list(node.attr("activation_beta") or [])
    functions = []
    for name in names:
        key = next((k for k in ACTIVATIONS if k.lower() == name.lower()), None)
        if key is None:
            raise UnsupportedError(f"{b.where}: activation {name!r} (one of {', '.join(ACTIVATIONS)})")
        template, alpha, beta = ACTIVATIONS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        functions.append(
            lambda x, t=template, a=alpha, c=beta: t.format(
                x=x, alpha=_number(a) if a is not None else "", beta=_number(c) if c is not None else ""
            )
        )
    return [functions[d * len(defaults) : (d + 1) * len(defaults)] for d in range(directions)]


class _Recurrent(Converter):
    """What RNN, GRU and LSTM share: operands, directions, the input projection, the stacking
    of the outputs.  A subclass gives ``GATES`` (the gate count), ``DEFAULTS`` (activations) and
    ``_step`` (one time step)."""

    CONSTANT_INPUTS = (4,)  # sequence_lens: planned on, as a shape
    GATES = 1
    STATES = 1  # the hidden state; LSTM's cell state too
    DEFAULTS: list[str] = []

    @staticmethod
    def _block(b: Builder, node, loop: _Loop, initial: list, r: Value, biases, inputs: list, d: int, f) -> list[Value]:
        """Writes one direction's time loop into ``loop`` (the gates' activations ``f``, the
        initial states ``initial``, None where zeros); returns the values of its states, each
        indexed by step."""
        raise NotImplementedError

    @staticmethod
    def _step(b: Builder, node, now: Value, state: list, r: Value, biases, inputs: list, d: int, f, clip, hidden: int):
        """One time step unrolled, from ``now`` (this time's input projection) and ``state``
        (the states after the step before); returns the new states."""
        raise NotImplementedError

    @classmethod
    def _lower(cls, b: Builder, node, inputs: list) -> list[Value | None]:
        x, w, r = inputs[:3]
        bias, lengths, initial_h = (inputs + [None] * 8)[3:6]
        batchwise = bool(node.attr("layout", 0))
        direction = node.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise UnsupportedError(f"{b.where}: direction {direction!r}")
        directions = 2 if direction == "bidirectional" else 1
        if x.rank != 3 or w.rank != 3 or r.rank != 3 or w.shape[0] != directions:
            raise UnsupportedError(
                f"{b.where}: X, W and R of shapes {x.shape}, {w.shape}, {r.shape} for {directions} direction(s)"
            )
        steps, batch = (x.shape[1], x.shape[0]) if batchwise else x.shape[:2]
        hidden = int(node.attr("hidden_size", r.shape[-1]))
        if w.shape[1] != cls.GATES * hidden or r.shape[1:] != (cls.GATES * hidden, hidden):
            raise UnsupportedError(
                f"{b.where}: W {w.shape} and R {r.shape} for hidden_size {hidden} ({cls.GATES} gates)"
            )
        ends = None  # each batch entry's length, where one is shorter than the sequence
        if lengths is not None:
            given = _require_const(b, lengths, "sequence_lens").reshape(-1).astype(np.int64)
            if given.shape != (batch,) or np.any(given < 0) or np.any(given > steps):
                raise UnsupportedError(
                    f"{b.where}: sequence_lens {given.tolist()} for a batch of {batch} and {steps} steps"
                )
            ends = given if np.any(given != steps) else None
        activations = _activations(b, node, cls.DEFAULTS, directions)
        clip = node.attr("clip")
        given_states = (inputs + [None] * 8)[5 : 5 + cls.STATES]
        states = [cls._per_direction(b, v, batchwise) if v is not None else None for v in given_states]
        if ends is None and steps > 0 and (batch == 1 or not cls._gemm_per_step(node)):
            return cls._lower_looped(b, node, inputs, x, (w, r, bias), states, activations, clip, batchwise, hidden)
        per_step: list[list[Value]] = []
        last = []
        for d in range(directions):
            reverse = direction == "reverse" or d == 1
            weights = [
                b.part(w, w.shape[1:], d * w.shape[1] * w.shape[2]),
                b.part(r, r.shape[1:], d * r.shape[1] * r.shape[2]),
            ]
            biases = b.part(bias, (2 * cls.GATES * hidden,), d * 2 * cls.GATES * hidden) if bias is not None else None
            projected = cls._projection(b, node, x, weights[0], biases, batchwise, hidden)
            state = [s[d] if s is not None else b.const(np.zeros((batch, hidden), x.dtype)) for s in states]
            outputs: dict[int, Value] = {}  # (by step with lengths, else by time)
            for step in range(steps):
                t = steps - 1 - step if reverse else step
                if ends is not None and reverse:  # each entry from its own end
                    now = _rows_at(b, projected, np.maximum(ends - 1 - step, 0))
                else:
                    now = b.part(projected, (batch, cls.GATES * hidden), t * batch * cls.GATES * hidden)
                new = cls._step(b, node, now, state, weights[1], biases, inputs, d, activations[d], clip, hidden)
                state = new if ends is None else _held(b, step < ends, new, state)
                outputs[step if ends is not None else t] = state[0]
            per_step.append([outputs[t] for t in range(steps)])
            if ends is not None:  # an empty entry's last states are zeros, as onnxruntime gives them
                state = _held(b, ends > 0, state, [b.const(np.zeros(s.shape, s.dtype)) for s in state])
            last.append(state)
        results: list[Value | None] = []
        if node.outputs and node.outputs[0] and ends is not None:
            y = _padded_outputs(b, per_step, ends, direction)
            results.append(transposed(b, y, [2, 0, 1, 3]) if batchwise else y)
        elif node.outputs and node.outputs[0]:
            pieces = [b.view(per_step[d][t], (1, batch, hidden)) for t in range(steps) for d in range(directions)]
            y = b.view(concatenated(b, pieces, 0), (steps, directions, batch, hidden))
            results.append(transposed(b, y, [2, 0, 1, 3]) if batchwise else y)
        else:
            results.append(None)
        for k in range(1, len(node.outputs)):
            if not node.outputs[k]:
                results.append(None)
                continue
            final = b.view(
                concatenated(b, [b.view(s[k - 1], (1, batch, hidden)) for s in last], 0), (directions, batch, hidden)
            )
            results.append(transposed(b, final, [1, 0, 2]) if batchwise else final)
        return results

    @staticmethod
    def _gemm_per_step(node) -> bool:
        """Whether each step's recurrent products are contractions of the state before with the
        weights (RNN, LSTM, GRU with ``linear_before_reset``): unrolled, each step is then one
        contraction kernel (polyc/codegen/gemm.py) that reuses the weights across the batch,
        where the time loop's kernel reads them once per batch entry."""
        return True

    @classmethod
    def _lower_looped(
        cls, b, node, inputs, x, weights, states, activations, clip, batchwise, hidden
    ) -> list[Value | None]:
        """The layer with its time loop inside one kernel per direction (see the module doc)."""
        w, r, bias = weights
        steps, batch = (x.shape[1], x.shape[0]) if batchwise else x.shape[:2]
        directions = len(activations)
        direction = node.attr("direction", "forward")
        sequences, last = [], []
        for d in range(directions):
            reverse = direction == "reverse" or d == 1
            recurrent = b.part(r, r.shape[1:], d * r.shape[1] * r.shape[2])
            biases = b.part(bias, (2 * cls.GATES * hidden,), d * 2 * cls.GATES * hidden) if bias is not None else None
            projected = cls._projection(
                b, node, x, b.part(w, w.shape[1:], d * w.shape[1] * w.shape[2]), biases, batchwise, hidden
            )
            initial = [s[d] if s is not None else None for s in states]
            loop = _Loop(b, steps, batch, hidden, reverse, projected, clip)
            produced = cls._block(b, node, loop, initial, recurrent, biases, inputs, d, activations[d])
            sequences.append(produced[0])
            size = batch * hidden
            last.append([b.part(s, (batch, hidden), (steps - 1) * size) for s in produced])
        results: list[Value | None] = []
        if node.outputs and node.outputs[0]:
            y = b.new((steps, directions, batch, hidden), x.dtype)
            terms = []
            for d, states_of_steps in enumerate(sequences):
                reverse = direction == "reverse" or d == 1
                terms.append(b.ref(states_of_steps, [f"{steps - 1} - i0" if reverse else "i0", "i2", "i3"]))
            value = terms[0] if len(terms) == 1 else f"(i1 == 0) ? {terms[0]} : {terms[1]}"
            b.emit([b.statement(y, indices(4), "=", value)], sequences, [y], "other")
            results.append(transposed(b, y, [2, 0, 1, 3]) if batchwise else y)
        else:
            results.append(None)
        for k in range(1, len(node.outputs)):
            if not node.outputs[k]:
                results.append(None)
                continue
            final = b.view(
                concatenated(b, [b.view(s[k - 1], (1, batch, hidden)) for s in last], 0), (directions, batch, hidden)
            )
            results.append(transposed(b, final, [1, 0, 2]) if batchwise else final)
        return results

    @classmethod
    def _impl_v7(cls, b, node, inputs):
        return cls._lower(b, node, inputs)

    @staticmethod
    def _per_direction(b: Builder, state: Value, batchwise: bool) -> list[Value]:
        """An initial state, (directions, batch, hidden) or batchwise (batch, directions,
        hidden), as one (batch, hidden) value per direction."""
        if batchwise:
            state = transposed(b, state, [1, 0, 2])
        size = state.shape[1] * state.shape[2]
        return [b.part(state, state.shape[1:], d * size) for d in range(state.shape[0])]

    @classmethod
    def _projection(cls, b: Builder, node, x: Value, w: Value, biases, batchwise: bool, hidden: int) -> Value:
        """``X W^T`` plus the biases that add to it, for every time step: (steps, batch, gates)."""
        steps, batch = (x.shape[1], x.shape[0]) if batchwise else x.shape[:2]
        out = b.new((steps, batch, w.shape[0]), x.dtype)
        read = b.ref(x, ["i1", "i0", "r0"] if batchwise else ["i0", "i1", "r0"])
        statements = [b.statement(out, indices(3), "+=!", f"{read} * {b.ref(w, ['i2', 'r0'])}", [("r0", x.shape[2])])]
        reads = [x, w]
        if biases is not None:
            gates = w.shape[0]
            both = f"{b.ref(biases, ['i2'])} + {b.ref(biases, [f'i2 + {gates}'])}"
            if cls.GATES == 3 and node.attr("linear_before_reset", 0):
                # GRU's hidden gate keeps its recurrent bias inside the reset gate's product
                both = f"(i2 < {2 * hidden} ? {both} : {b.ref(biases, ['i2'])})"
            statements.append(b.statement(out, indices(3), "=", f"{out.ident}(i0, i1, i2) + {both}"))
            reads.append(biases)
        b.emit(statements, reads, [out], "contraction")
        return out

    @staticmethod
    def _recurrent_product(
        b: Builder, previous: Value, r: Value, now: Value, rows: int, column: int = 0, extra=None
    ) -> Value:
        """``now[:, column:column + rows] + H_prev R[:rows]^T``: (batch, rows); ``extra``:
        (expression of H_prev's element, values it reads) that multiplies it first."""
        batch, hidden = previous.shape
        out = b.new((batch, rows), previous.dtype)
        h = b.ref(previous, ["i0", "r0"])
        factor, reads = extra(h) if extra else (h, [])
        step = b.ref(now, ["i0", f"i1 + {column}" if column else "i1"])
        b.emit(
            [
                b.statement(out, ["i0", "i1"], "+=!", f"{factor} * {b.ref(r, ['i1', 'r0'])}", [("r0", hidden)]),
                b.statement(out, ["i0", "i1"], "=", f"{out.ident}(i0, i1) + {step}"),
            ],
            [previous, r, now] + reads,
            [out],
            "contraction",
        )
        return out


class _Loop:
    """Writes the statements of one direction's ``for s in 0:steps`` block: step ``s``, batch
    entry ``i0``, hidden unit or gate row ``i1``, reduction index ``r0``.  Every value it makes
    is ``(steps, batch, columns)``, indexed by step."""

    def __init__(self, b: Builder, steps: int, batch: int, hidden: int, reverse: bool, projected: Value, clip):
        self.b, self.steps, self.batch, self.hidden = b, steps, batch, hidden
        self.projected, self.clip = projected, clip
        self.time = f"{steps - 1} - s" if reverse else "s"  # the time step s reads
        self.statements: list[str] = []
        self.reads: list[Value] = [projected]
        self.writes: list[Value] = []

    def new(self, columns: int) -> Value:
        value = self.b.new((self.steps, self.batch, columns), self.projected.dtype)
        self.writes.append(value)
        return value

    def add(self, target: Value, op: str, rhs: str, reduction: bool = False) -> None:
        ranges = f"i0 in 0:{self.batch}, i1 in 0:{target.shape[2]}" + (f", r0 in 0:{self.hidden}" if reduction else "")
        self.statements.append(f"{target.ident}(s, i0, i1) {op} {rhs} where {ranges}")

    def now(self, column: str) -> str:
        """The input projection (with its biases) of this step's time at ``column``."""
        return self.b.ref(self.projected, [self.time, "i0", column])

    def previous(self, states: Value, initial: Value | None, column: str) -> str:
        """The state the step before wrote, at ``column``; the initial state (zeros when none
        is given) at the first step."""
        first = self.b.ref(initial, ["i0", column]) if initial is not None else tc_type(states.dtype) + "(0)"
        self.reads += [initial] if initial is not None else []
        return f"(s >= 1 ? {states.ident}(s - 1, i0, {column}) : {first})"

    def clipped(self, expression: str) -> str:
        return _clipped(expression, self.clip)

    def emit(self, states: list[Value], reads: list) -> None:
        self.reads += [v for v in reads if v is not None]
        body = "\n".join(f"        {s}" for s in self.statements)
        block = f"for s in 0:{self.steps} {{\n{body}\n    }}"
        # Each statement its own loop nest inside the step (isl's fusion, minimal): fused with the
        # activation after it, a recurrent product ran along the hidden units with the weights'
        # rows strided and the activation under a condition in the vector loop, six times slower
        # (RNN, hidden 256) than as dot products along the weights' rows.
        self.b.emit([block], self.reads, self.writes, "recurrence", {"fusion": "min"}, states=states)


def _rows_at(b: Builder, projected: Value, times: np.ndarray) -> Value:
    """Row ``k`` of the input projection at time ``times[k]`` (a reverse direction's step of
    entries of different lengths)."""
    steps, batch, gates = projected.shape
    when = b.const(times.astype(np.int64))
    now = b.new((batch, gates), projected.dtype)
    b.emit(
        [b.statement(now, ["i0", "i1"], "=", b.ref(projected, [b.ref(when, ["i0"]), "i0", "i1"]))],
        [projected, when],
        [now],
        "other",
    )
    return now


def _held(b: Builder, active: np.ndarray, new: list[Value], old: list[Value]) -> list[Value]:
    """The states after a step: the new ones for the batch entries still in their sequence
    (``active``), the old ones for the others."""
    if active.all():
        return new
    going = b.const(active.astype(np.bool_))
    held = []
    for fresh, previous in zip(new, old):
        out = b.new(fresh.shape, fresh.dtype)
        b.emit(
            [
                b.statement(
                    out,
                    ["i0", "i1"],
                    "=",
                    f"{b.ref(going, ['i0'])} ? {b.ref(fresh, ['i0', 'i1'])} : {b.ref(previous, ['i0', 'i1'])}",
                )
            ],
            [going, fresh, previous],
            [out],
            "elementwise",
        )
        held.append(out)
    return held


def _padded_outputs(b: Builder, per_step: list[list[Value]], ends: np.ndarray, direction: str) -> Value:
    """``Y`` (steps, directions, batch, hidden) of entries shorter than the sequence: at time t,
    entry k's state after the step that read time t (step t forward; step ends[k] - 1 - t in
    reverse), zeros past its length."""
    steps, batch, hidden = len(per_step[0]), *per_step[0][0].shape
    stacked = [
        b.view(concatenated(b, [b.view(s, (1, batch, hidden)) for s in states], 0), (steps, batch, hidden))
        for states in per_step
    ]
    terms, reads = [], []
    for d, states in enumerate(stacked):
        reverse = direction == "reverse" or d == 1
        time = np.arange(steps).reshape(steps, 1)
        source = np.where(time < ends.reshape(1, batch), ends.reshape(1, batch) - 1 - time if reverse else time, -1)
        table = b.const(source.astype(np.int64))
        at = b.ref(table, ["i0", "i2"])
        terms.append(f"({at} >= 0) ? {b.ref(states, [at, 'i2', 'i3'])} : {tc_type(states.dtype)}(0)")
        reads += [states, table]
    y = b.new((steps, len(stacked), batch, hidden), stacked[0].dtype)
    value = terms[0] if len(terms) == 1 else f"(i1 == 0) ? ({terms[0]}) : ({terms[1]})"
    b.emit([b.statement(y, indices(4), "=", value)], reads, [y], "other")
    return y


def _clipped(expression: str, clip) -> str:
    return expression if clip is None else f"fmin(fmax({expression}, {_number(-clip)}), {_number(clip)})"


class RNN(_Recurrent):
    GATES = 1
    DEFAULTS = ["Tanh"]

    @staticmethod
    def _block(b, node, loop: _Loop, initial, r, biases, inputs, d, f) -> list[Value]:
        states = loop.new(loop.hidden)
        pre = loop.new(loop.hidden)
        loop.add(pre, "+=!", f"{loop.previous(states, initial[0], 'r0')} * {b.ref(r, ['i1', 'r0'])}", reduction=True)
        loop.add(states, "=", f[0](loop.clipped(f"{pre.ident}(s, i0, i1) + {loop.now('i1')}")))
        loop.emit([states], [r])
        return [states]

    @staticmethod
    def _step(b, node, now, state, r, biases, inputs, d, f, clip, hidden):
        (previous,) = state[:1]
        pre = _Recurrent._recurrent_product(b, previous, r, now, hidden)
        out = b.new(previous.shape, previous.dtype)
        b.emit(
            [b.statement(out, ["i0", "i1"], "=", f[0](_clipped(b.ref(pre, ["i0", "i1"]), clip)))],
            [pre],
            [out],
            "elementwise",
        )
        return [out]


class GRU(_Recurrent):
    GATES = 3
    DEFAULTS = ["Sigmoid", "Tanh"]

    @staticmethod
    def _gemm_per_step(node) -> bool:
        # Without linear_before_reset the reset gate scales the state inside the product.
        return bool(node.attr("linear_before_reset", 0))

    @staticmethod
    def _block(b, node, loop: _Loop, initial, r, biases, inputs, d, f) -> list[Value]:
        hidden = loop.hidden
        states = loop.new(hidden)
        products = loop.new(2 * hidden)  # H_prev R^T of the update and reset gates
        update, reset, candidate = loop.new(hidden), loop.new(hidden), loop.new(hidden)
        previous = loop.previous(states, initial[0], "r0")
        loop.add(products, "+=!", f"{previous} * {b.ref(r, ['i1', 'r0'])}", reduction=True)
        loop.add(update, "=", f[0](loop.clipped(f"{products.ident}(s, i0, i1) + {loop.now('i1')}")))
        loop.add(
            reset, "=", f[0](loop.clipped(f"{products.ident}(s, i0, i1 + {hidden}) + {loop.now(f'i1 + {hidden}')}"))
        )
        hidden_rows = b.ref(r, [f"i1 + {2 * hidden}", "r0"])
        reads = [r]
        if node.attr("linear_before_reset", 0):
            loop.add(candidate, "+=!", f"{previous} * {hidden_rows}", reduction=True)
            gated = f"{candidate.ident}(s, i0, i1)"
            if biases is not None:
                recurrent_bias = b.part(biases, (hidden,), 5 * hidden)
                gated = f"({gated} + {b.ref(recurrent_bias, ['i1'])})"
                reads.append(recurrent_bias)
            new = f"{loop.now(f'i1 + {2 * hidden}')} + {reset.ident}(s, i0, i1) * {gated}"
        else:
            loop.add(candidate, "+=!", f"{reset.ident}(s, i0, r0) * {previous} * {hidden_rows}", reduction=True)
            new = f"{candidate.ident}(s, i0, i1) + {loop.now(f'i1 + {2 * hidden}')}"
        z = f"{update.ident}(s, i0, i1)"
        loop.add(
            states, "=", f"(1 - {z}) * ({f[1](loop.clipped(new))}) + {z} * {loop.previous(states, initial[0], 'i1')}"
        )
        loop.emit([states], reads)
        return [states]

    @staticmethod
    def _step(b, node, now, state, r, biases, inputs, d, f, clip, hidden):
        (previous,) = state[:1]
        update_reset = _Recurrent._recurrent_product(b, previous, r, now, 2 * hidden)
        reset = b.new(previous.shape, previous.dtype)
        b.emit(
            [
                b.statement(
                    reset, ["i0", "i1"], "=", f[0](_clipped(b.ref(update_reset, ["i0", f"i1 + {hidden}"]), clip))
                )
            ],
            [update_reset],
            [reset],
            "elementwise",
        )
        hidden_rows = b.part(r, (hidden, hidden), 2 * hidden * hidden)
        candidate_input = f"{b.ref(now, ['i0', f'i1 + {2 * hidden}'])}"
        if node.attr("linear_before_reset", 0):
            product = b.new(previous.shape, previous.dtype)
            b.emit(
                [
                    b.statement(
                        product,
                        ["i0", "i1"],
                        "+=!",
                        f"{b.ref(previous, ['i0', 'r0'])} * {b.ref(hidden_rows, ['i1', 'r0'])}",
                        [("r0", hidden)],
                    )
                ],
                [previous, hidden_rows],
                [product],
                "contraction",
            )
            recurrent_bias = b.part(biases, (hidden,), 5 * hidden) if biases is not None else None
            gated = b.ref(product, ["i0", "i1"])
            if recurrent_bias is not None:
                gated = f"({gated} + {b.ref(recurrent_bias, ['i1'])})"
            candidate = f"{candidate_input} + {b.ref(reset, ['i0', 'i1'])} * {gated}"
            reads = [product, reset, now] + ([recurrent_bias] if recurrent_bias is not None else [])
        else:
            product = _Recurrent._recurrent_product(
                b,
                previous,
                hidden_rows,
                now,
                hidden,
                column=2 * hidden,
                extra=lambda h: (f"{b.ref(reset, ['i0', 'r0'])} * {h}", [reset]),
            )
            candidate = b.ref(product, ["i0", "i1"])
            reads = [product]
        out = b.new(previous.shape, previous.dtype)
        update = f[0](_clipped(b.ref(update_reset, ["i0", "i1"]), clip))
        new = f[1](_clipped(candidate, clip))
        b.emit(
            [
                b.statement(
                    out, ["i0", "i1"], "=", f"(1 - {update}) * ({new}) + {update} * {b.ref(previous, ['i0', 'i1'])}"
                )
            ],
            reads + [update_reset, previous],
            [out],
            "elementwise",
        )
        return [out]


class LSTM(_Recurrent):
    GATES = 4
    STATES = 2
    DEFAULTS = ["Sigmoid", "Tanh", "Tanh"]

    @staticmethod
    def _block(b, node, loop: _Loop, initial, r, biases, inputs, d, f) -> list[Value]:
        hidden = loop.hidden
        states, cells = loop.new(hidden), loop.new(hidden)
        products = loop.new(4 * hidden)  # H_prev R^T of the gates i, o, f, c
        loop.add(products, "+=!", f"{loop.previous(states, initial[0], 'r0')} * {b.ref(r, ['i1', 'r0'])}", True)
        peepholes = inputs[7] if len(inputs) > 7 else None
        peephole = [None] * 3
        if peepholes is not None:  # (directions, 3 * hidden): input, output, forget
            peephole = [b.part(peepholes, (hidden,), (d * 3 + k) * hidden) for k in range(3)]

        def gate(k: int, with_cell: str | None, which: int | None) -> str:
            column = f"i1 + {k * hidden}" if k else "i1"
            pre = f"{products.ident}(s, i0, {column}) + {loop.now(column)}"
            if which is not None and peephole[which] is not None:
                pre = f"{pre} + {b.ref(peephole[which], ['i1'])} * {with_cell}"
            return loop.clipped(pre)

        old = loop.previous(cells, initial[1] if len(initial) > 1 else None, "i1")
        input_gate = f[0](gate(0, old, 0))
        forget = f"(1 - {input_gate})" if node.attr("input_forget", 0) else f[0](gate(2, old, 2))
        loop.add(cells, "=", f"{forget} * {old} + {input_gate} * {f[1](gate(3, None, None))}")
        fresh = f"{cells.ident}(s, i0, i1)"
        loop.add(states, "=", f"{f[0](gate(1, fresh, 1))} * {f[2](fresh)}")
        loop.emit([states, cells], [r] + [p for p in peephole if p is not None])
        return [states, cells]

    @staticmethod
    def _step(b, node, now, state, r, biases, inputs, d, f, clip, hidden):
        previous, cell = state
        gates = _Recurrent._recurrent_product(b, previous, r, now, 4 * hidden)
        peepholes = inputs[7] if len(inputs) > 7 else None
        peephole = [None] * 3
        if peepholes is not None:  # (directions, 3 * hidden): input, output, forget
            peephole = [b.part(peepholes, (hidden,), (d * 3 + k) * hidden) for k in range(3)]

        def gate(k: int, with_cell: str | None, which: int | None) -> str:
            pre = b.ref(gates, ["i0", f"i1 + {k * hidden}" if k else "i1"])
            if which is not None and peephole[which] is not None:
                pre = f"{pre} + {b.ref(peephole[which], ['i1'])} * {with_cell}"
            return _clipped(pre, clip)

        old = b.ref(cell, ["i0", "i1"])
        input_gate = f[0](gate(0, old, 0))
        forget = f"(1 - {input_gate})" if node.attr("input_forget", 0) else f[0](gate(2, old, 2))
        new_cell = b.new(cell.shape, cell.dtype)
        out = b.new(previous.shape, previous.dtype)
        fresh = b.ref(new_cell, ["i0", "i1"])
        output_gate = f[0](gate(1, fresh, 1))
        reads = [gates, cell] + [p for p in peephole if p is not None]
        candidate = f[1](gate(3, None, None))
        b.emit(
            [
                b.statement(new_cell, ["i0", "i1"], "=", f"{forget} * {old} + {input_gate} * {candidate}"),
                b.statement(out, ["i0", "i1"], "=", f"{output_gate} * {f[2](fresh)}"),
            ],
            reads,
            [new_cell, out],
            "elementwise",
        )
        return [out, new_cell]


#: The converters of this module, joined to :data:`polyc.frontends.onnx.ops.CONVERTERS`.
RECURRENT = {"RNN": RNN, "GRU": GRU, "LSTM": LSTM}
