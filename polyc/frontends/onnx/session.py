"""``polyc.onnx.InferenceSession``: onnxruntime's session API over polyc kernels.

    session = polyc.onnx.InferenceSession("model.onnx")        # ort.InferenceSession("model.onnx")
    (logits,) = session.run(None, {"input": images})

The model is loaded, checked and every node's operator looked up when the session is made (all
unsupported operators are reported at once).  A run with input shapes not seen before plans and
compiles the model for them (:class:`~polyc.frontends.onnx.plan.Plan`); its kernels land in
polyc's disk cache, so a new process compiles nothing it has compiled before.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass

import numpy as np

from polyc.errors import PolycError, PolycWarning, SignatureError, UnsupportedError
from polyc.frontends.onnx.float16 import computed_in_float32
from polyc.frontends.onnx.functions import CONSTANT_INPUTS, flatten
from polyc.frontends.onnx.model import default_opset, initializers, load_model, tensor_info
from polyc.frontends.onnx.plan import Group, Plan, is_converted, unsupported_error

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, strings for symbolic
    dimensions, None when unknown) and type (``tensor(float)``)."""

    name: str
    shape: list | None
    type: str


@dataclass(frozen=True)
class KernelTime:
    """One kernel call of a run (:meth:`InferenceSession.profile`): its group's name (as in
    ``tc_source()``), the ONNX nodes fused into it, its median wall time and its kernel."""

    name: str
    nodes: list
    seconds: float
    kernel: object

    def __str__(self) -> str:
        return f"{self.name:>8} {self.seconds * 1e3:9.3f} ms  {', '.join(self.nodes)}"


class InferenceSession:
    """Runs an ONNX model with polyc.  ``model``: a ModelProto (never modified), a path or bytes.
    ``graph_fusion`` (default True) folds batch normalizations into convolutions and fuses
    elementwise operators into the kernels that feed them; ``channels_last`` (default: as
    ``graph_fusion``) computes 2-D convolutions and the operators between them in NHWC; every
    other keyword is a ``polyc.define`` option (``fusion``, ``threads``, ``cflags``, ...)
    used for every kernel; ``winograd`` defaults to True here (3 x 3 convolutions by Winograd's
    F(2x2, 3x3), :mod:`polyc.codegen.winograd`, as onnxruntime's and oneDNN's CPU kernels may
    choose their algorithm).

    ``progress``: a progress bar over the kernels of each first run's compile: None (the
    default) where the output is a terminal or a notebook and tqdm is installed, unless
    ``POLYC_PROGRESS=0``; False never; True always.  What is planned, each kernel built or taken
    from the cache, and the timings are logged on the ``polyc`` loggers (:mod:`logging`).

    onnxruntime's arguments are taken as onnxruntime takes them, so that switching needs no
    other change: ``sess_options`` (an ``onnxruntime.SessionOptions``) sets the kernels' threads
    from ``intra_op_num_threads`` (unless ``threads`` is given; 0 is onnxruntime's default, all
    cores), and ``graph_optimization_level`` ``ORT_DISABLE_ALL`` turns ``graph_fusion`` off
    (unless it is given); settings polyc has no counterpart for (a profile file, an optimized
    model to write) are warned about.  ``providers``: polyc computes on the CPU, as
    ``CPUExecutionProvider``; any other provider is warned about, as onnxruntime warns about a
    provider it does not have, and the session runs on the CPU.  ``provider_options``, when
    given, has one dict per provider."""

    def __new__(cls, model=None, *args, **kwargs):
        """A saved session (a file or bytes ``save`` wrote) loads as a
        :class:`~polyc.frontends.onnx.saved.SavedSession`, without a C compiler."""
        from polyc.frontends.onnx.saved import SavedSession, is_saved_session

        if is_saved_session(model):
            unknown = sorted(set(kwargs) - {"threads", "sess_options", "providers", "provider_options"})
            if unknown:
                raise PolycError(
                    f"a saved session is compiled already: {', '.join(unknown)} cannot change it (threads= can)"
                )
            return SavedSession(model, threads=kwargs.get("threads"))
        return super().__new__(cls)

    def __init__(
        self,
        model,
        sess_options=None,
        providers=None,
        provider_options=None,
        *,
        graph_fusion: bool | None = None,
        channels_last: bool | None = None,
        progress: bool | None = None,
        **options,
    ):
        from polyc.options import Options

        graph_fusion = _onnxruntime_arguments(sess_options, providers, provider_options, graph_fusion, options)
        options = {"winograd": True, **options}
        Options.from_kwargs(**options)  # a bad option fails now, not at the first run
        if options.get("loop_order") is not None:
            raise PolycError(
                "loop_order is not an option of a session: it names the indices of one TC def, "
                "and a session's defs have indices the ONNX lowering names (polyc.tune(session, "
                "feeds) searches each kernel's loop order)"
            )
        self._model, self._where = load_model(model)
        self._opset = default_opset(self._model)
        # (Operators expanded into their function bodies are built for their inputs' types,
        # which the float32 rewrite would leave unknown: such models keep their float16.)
        if all(is_converted(node.op_type, node.domain, self._opset) for node in self._model.graph.node):
            self._model = computed_in_float32(self._model)
        graph = self._model.graph
        flat_nodes, missing = flatten(graph, self._opset, is_converted)
        if missing:
            raise unsupported_error(missing, self._where)
        self._constants = initializers(graph)
        self._inputs = [tensor_info(v) for v in graph.input if v.name not in self._constants]
        self._outputs = [tensor_info(v) for v in graph.output]
        #: The inputs' element types, each one polyc computes in.
        self._input_dtypes: dict[str, np.dtype] = {}
        for info in self._inputs:
            if info.dtype is None:
                raise PolycError(
                    f"{self._where}: input {info.name!r} has type {info.type}, which polyc cannot compute in"
                )
            self._input_dtypes[info.name] = info.dtype
        self._specialised = _specialising_inputs(flat_nodes, {i.name: i for i in self._inputs})
        if progress is not None and not isinstance(progress, bool):
            raise PolycError(f"progress must be True, False or None (where the output is watched), not {progress!r}")
        self._progress = progress
        self._options = options
        self.graph_fusion = graph_fusion
        self.channels_last = graph_fusion if channels_last is None else bool(channels_last)
        self._plans: dict[tuple, Plan] = {}
        self._last: Plan | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ onnxruntime's API
    def get_providers(self) -> list[str]:
        """Where the session computes: on the CPU, as onnxruntime's ``CPUExecutionProvider``."""
        return [CPU_PROVIDER]

    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(i.name, list(i.shape) if i.shape is not None else None, i.type) for i in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg(o.name, list(o.shape) if o.shape is not None else None, o.type) for o in self._outputs]

    def get_modelmeta(self):
        return self._model.metadata_props

    def run(self, output_names, input_feed: dict, run_options=None) -> list[np.ndarray]:
        """The outputs named in ``output_names`` (None: all), in that order."""
        if not isinstance(input_feed, dict):
            raise SignatureError(f"input_feed must be a dict of input name -> array, not {type(input_feed).__name__}")
        known = [o.name for o in self._outputs]
        names = known if output_names is None else list(output_names)
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SignatureError(
                f"Invalid output name(s): {', '.join(map(repr, unknown))}; "
                f"the model's outputs are {', '.join(map(repr, known))}"
            )
        plan, feeds = self._plan_for_feeds(input_feed)
        results = plan.run(feeds)
        return [results[n] for n in names]

    # ------------------------------------------------------------------ what it did
    def plan_for(self, shapes: dict, values: dict | None = None) -> Plan:
        """The plan (kernels and views) for inputs of these shapes, made on first use.
        ``values``: the contents of the inputs that give shapes, axes or pads to the model
        (see ``CONSTANT_INPUTS`` in :mod:`.ops`); the plan is specialised on them too."""
        given = values if values is not None else {}
        values = {name: np.array(given[name]) for name in self._specialised}
        key = tuple(tuple(shapes[i.name]) for i in self._inputs) + tuple(
            (name, array.dtype.str, array.shape, array.tobytes()) for name, array in sorted(values.items())
        )
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    runtime = [i for i in self._inputs if i.name not in values]
                    logger.info(
                        "planning %s for input shapes %s",
                        self._where,
                        ", ".join(f"{i.name}={tuple(shapes[i.name])}" for i in runtime) or "()",
                    )
                    plan = Plan(
                        self._model.graph,
                        self._opset,
                        {i.name: tuple(shapes[i.name]) for i in runtime},
                        {i.name: self._input_dtypes[i.name] for i in runtime},
                        {**self._constants, **values},
                        self._options,
                        self.graph_fusion,
                        self.channels_last,
                        progress=self._progress,
                    )
                    self._plans[key] = plan
        self._last = plan
        return plan

    def _plan(self, shapes: dict | None) -> Plan:
        if shapes is not None and self._specialised:
            raise PolycError(
                f"inputs {', '.join(sorted(self._specialised))} give the model shapes or axes: "
                "run the session once to plan it"
            )
        if shapes is not None:
            return self.plan_for(shapes)
        if self._last is None:
            concrete = {}
            for info in self._inputs:
                if info.shape is None or not all(isinstance(d, int) for d in info.shape):
                    raise PolycError(
                        f"input {info.name!r} has symbolic dimensions {info.shape}: "
                        "run the session once or pass shapes={name: shape}"
                    )
                concrete[info.name] = info.shape
            return self.plan_for(concrete)
        return self._last

    def tc_source(self, shapes: dict | None = None) -> str:
        """The model as TC for ``shapes`` (default: the last run's): one def per kernel, then the
        order of calls and views.  A model planned in stages (:mod:`.stages`) shows each stage
        the last run took, after a line naming the value it had to learn."""
        stages = self._plan(shapes).stages()
        parts = []
        for number, stage in enumerate(stages):
            continuation = stages[number - 1].continuation if number else None
            if continuation is not None:  # (each stage after the first continues the one before)
                learned = ", ".join(repr(p) for p in continuation.probes)
                parts.append(
                    f"# ---- stage {number + 1}, planned once {learned} was known "
                    f"(computed by the stage before from the model's data)\n"
                )
            parts.append(stage.tc_source())
        if stages[-1].continuation is not None:  # not run yet
            learned = ", ".join(repr(p) for p in stages[-1].continuation.probes)
            parts.append(
                f"# ---- the rest is planned once {learned} is known (computed from "
                "the model's data): run the session to see it\n"
            )
        return "\n".join(parts)

    @property
    def groups(self) -> list[list[str]]:
        """For the last run's plan: the ONNX nodes of each kernel, in execution order."""
        return [g.nodes for stage in self._plan(None).stages() for g in stage.groups]

    def kernels(self, shapes: dict | None = None) -> list:
        """The polyc kernels (``polyc.Kernel``) of the plan, for ``stages()``/``c_source()``."""
        return [g.kernel for stage in self._plan(shapes).stages() for g in stage.groups]

    def kernel_inputs(self, input_feed: dict) -> list:
        """Each kernel call of a run on ``input_feed`` (as :meth:`run` takes it), in order: its
        group (``.kernel``, ``.name``) and the arrays it reads (copies of the intermediate
        ones); what a tuner measures the kernels on (:mod:`polyc.tuning.session`)."""
        plan, feeds = self._plan_for_feeds(input_feed)
        return plan.kernel_inputs(feeds)

    def profile(self, input_feed: dict, repeat: int = 10) -> list[KernelTime]:
        """Where a run on ``input_feed`` (as :meth:`run` takes it) spends its time: each kernel
        call of the plan, in the order of the run, with the median of its wall times over
        ``repeat`` runs, timed inside the runs (the arena's memory, the caches as the kernels
        before left them: a kernel timed alone on its own inputs can be faster or, with fresh
        outputs whose pages fault in, far slower).  The run before them plans and compiles."""
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise PolycError(f"repeat must be a positive number of runs, not {repeat!r}")
        plan, feeds = self._plan_for_feeds(input_feed)
        plan.run(feeds)
        groups = [item for stage in plan.stages() for item in stage.order if isinstance(item, Group)]
        runs = []
        for _ in range(repeat + 1):  # a run through the checked path (a new arena's first) has no times
            seconds: list[float] = []
            plan.run(feeds, seconds)
            if len(seconds) == len(groups):
                runs.append(seconds)
            if len(runs) == repeat:
                break
        if not runs:
            raise PolycError("profile: no run took the resolved kernel calls")
        medians = np.median(np.array(runs), axis=0)
        return [KernelTime(g.name, g.nodes, float(t), g.kernel) for g, t in zip(groups, medians)]

    def export(self, directory, target="host", shapes: dict | None = None, name: str = "model"):
        """Write the model, planned for ``shapes`` (input name -> shape; default: the model's
        own, when fixed), as a C project into ``directory`` for ``target`` (``host``, ``avx2``,
        ``avx512``, ``neon``, ``neon-dotprod`` or ``generic``: :data:`polyc.target.TARGETS`): ``NAME.c`` (the API,
        the arena and the call sequence), ``NAME_kN.c`` (one kernel each), ``NAME.h``, the
        weights ``NAME.bin``, a demo ``main.c`` reading and writing ``.npy`` files, a
        ``Makefile`` and a ``CMakeLists.txt`` (:mod:`polyc.runtime.model_export`).  Building and
        running it needs a C compiler only.  Returns the
        :class:`~polyc.runtime.model_export.ModelExport` written.  A model planned in stages
        (data-dependent operators) is refused with an :class:`~polyc.UnsupportedError` naming
        the nodes."""
        from polyc.frontends.onnx.export import export_plan
        from polyc.options import Options
        from polyc.target import get_target, target_of

        chosen = get_target(target)
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise PolycError(
                f"export name must be a C identifier (it prefixes the API and names the files), not {name!r}"
            )
        if self._specialised:
            raise UnsupportedError(
                f"the model cannot be exported: its inputs {', '.join(sorted(self._specialised))} give it shapes or "
                "axes, which an exported model would have to fix"
            )
        concrete = self._export_shapes(shapes)
        if chosen.name == "host":
            plan = self.plan_for(concrete)
            chosen = target_of(Options.from_kwargs(**self._options))
        else:
            options = {
                **self._options,
                "cc": chosen.cc,
                "cflags": list(chosen.flags),
                "cache_sizes": chosen.cache_sizes,
            }
            runtime = self._inputs
            plan = Plan(
                self._model.graph,
                self._opset,
                {i.name: tuple(concrete[i.name]) for i in runtime},
                {i.name: self._input_dtypes[i.name] for i in runtime},
                dict(self._constants),
                options,
                self.graph_fusion,
                self.channels_last,
            )
        about = [
            f"From {self._where}, planned for "
            + (", ".join(f"{n}={'x'.join(map(str, s)) or 'scalar'}" for n, s in concrete.items()) or "no inputs")
            + f" (graph_fusion={self.graph_fusion}, channels_last={self.channels_last})."
        ]
        exported = export_plan(plan, chosen, name, tuned=target == "host", about=about)
        exported.write(directory)
        return exported

    def save(self, path, shapes: dict | None = None) -> None:
        """Save the session, planned for ``shapes`` (as :meth:`export` takes them), compiled for
        this machine into one file: ``polyc.onnx.InferenceSession(path)`` loads it in a new
        process without a C compiler (:mod:`polyc.frontends.onnx.saved`), for these shapes.
        A file saved on another processor or by another polyc, or damaged, is refused there."""
        from polyc.frontends.onnx.export import export_plan
        from polyc.frontends.onnx.saved import PREFIX, save
        from polyc.options import Options
        from polyc.target import LANGUAGE_FLAGS, target_of

        if self._specialised:
            raise UnsupportedError(
                f"the session cannot be saved: its inputs {', '.join(sorted(self._specialised))} give the model "
                "shapes or axes"
            )
        plan = self.plan_for(self._export_shapes(shapes))
        target = target_of(Options.from_kwargs(**self._options))
        exported = export_plan(plan, target, PREFIX, tuned=True, about=[f"A saved session of {self._where}."])
        save(exported, path, [*target.flags, *LANGUAGE_FLAGS, "-fopenmp"], target.c_compiler())

    def _export_shapes(self, shapes: dict | None) -> dict[str, tuple[int, ...]]:
        """Every input's shape for an export: from ``shapes``, else the model's fixed ones."""
        if shapes is not None and not isinstance(shapes, dict):
            raise PolycError(f"shapes must be a dict of input name -> shape, not {type(shapes).__name__}")
        shapes = shapes or {}
        known = [i.name for i in self._inputs]
        unknown = [n for n in shapes if n not in known]
        if unknown:
            raise SignatureError(
                f"shapes names no input of the model: {', '.join(map(repr, unknown))}; its inputs are "
                f"{', '.join(map(repr, known))}"
            )
        concrete = {}
        for info in self._inputs:
            shape = shapes.get(info.name, info.shape)
            if (
                shape is None
                or isinstance(shape, (str, bytes))
                or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape)
            ):
                raise PolycError(
                    f"input {info.name!r}: an export needs a shape of integers >= 0 "
                    + (
                        f"(the model gives {list(info.shape or ())}; pass shapes={{{info.name!r}: (...)}})"
                        if info.name not in shapes
                        else f"(got {shape!r})"
                    )
                )
            shape = tuple(int(d) for d in shape)
            if info.shape is not None:
                if len(shape) != len(info.shape):
                    raise SignatureError(
                        f"input {info.name!r}: shape {shape} has rank {len(shape)}, the model's has {len(info.shape)}"
                    )
                fixed = [(k, want) for k, want in enumerate(info.shape) if isinstance(want, int) and shape[k] != want]
                if fixed:
                    k, want = fixed[0]
                    raise SignatureError(f"input {info.name!r}: dimension {k} is {want} in the model, not {shape[k]}")
            concrete[info.name] = shape
        return concrete

    def plans(self) -> list[Plan]:
        """Every plan made so far (one per set of input shapes, and those of the stages after a
        plan that stopped to learn a value computed from data), the last run's first stage last."""
        plans = [each for p in self._plans.values() if p is not self._last for each in p.every_plan()]
        return plans + (self._last.every_plan()[::-1] if self._last is not None else [])

    # ------------------------------------------------------------------ feeds
    def _plan_for_feeds(self, input_feed: dict) -> tuple[Plan, dict[str, np.ndarray]]:
        """The plan for ``input_feed`` (checked, as :meth:`run` takes it) and the checked feeds."""
        feeds = self._check_feeds(input_feed)
        values = {name: feeds[name] for name in self._specialised}
        return self.plan_for({k: v.shape for k, v in feeds.items()}, values), feeds

    def _check_feeds(self, input_feed: dict) -> dict[str, np.ndarray]:
        expected = [i.name for i in self._inputs]
        missing = [n for n in expected if n not in input_feed]
        if missing:
            raise SignatureError(
                f"Required inputs ({', '.join(map(repr, missing))}) are missing from input feed "
                f"({', '.join(map(repr, input_feed))})"
            )
        extra = [n for n in input_feed if n not in expected]
        if extra:
            raise SignatureError(
                f"Invalid input name(s): {', '.join(map(repr, extra))}; "
                f"the model's inputs are {', '.join(map(repr, expected))}"
            )
        feeds: dict[str, np.ndarray] = {}
        symbols: dict[str, tuple[int, str, int]] = {}  # a symbolic dimension -> (extent, input, index)
        for info in self._inputs:
            value = input_feed[info.name]
            array = np.asarray(value)
            if array.dtype != info.dtype:
                raise SignatureError(
                    f"Unexpected input data type for {info.name!r}. "
                    f"Actual: tensor({array.dtype}), expected: {info.type}"
                )
            if info.shape is not None:
                if array.ndim != len(info.shape):
                    raise SignatureError(
                        f"Invalid rank for input: {info.name} Got: {array.ndim} "
                        f"Expected: {len(info.shape)} Please fix either the inputs or the model."
                    )
                for index, (got, want) in enumerate(zip(array.shape, info.shape)):
                    if isinstance(want, int) and got != want:
                        raise SignatureError(
                            f"Got invalid dimensions for input: {info.name} for the following "
                            f"indices index: {index} Got: {got} Expected: {want} "
                            "Please fix either the inputs or the model."
                        )
                    if isinstance(want, str):
                        seen = symbols.setdefault(want, (got, info.name, index))
                        if seen[0] != got:
                            raise SignatureError(
                                f"dimension {want!r} is {seen[0]} in input {seen[1]!r} "
                                f"(index {seen[2]}) but {got} in input {info.name!r} (index {index})"
                            )
            feeds[info.name] = array
        return feeds


def _specialising_inputs(flat_nodes, inputs: dict) -> set[str]:
    """Graph inputs (``inputs``: name -> TensorInfo) that a converter needs to know when the model
    is compiled (a Reshape's shape, a Slice's starts, a Pad's pads, ... also inside expanded
    functions): plans are specialised on their contents.  An input that feeds such a place
    directly counts, and so does an integer one that the value there is computed from (a
    CenterCropPad's target shape becomes pads by arithmetic), and a scalar of any type that an
    If's condition or a Loop's trip count or condition is computed from (control flow is
    planned: a Range's ONNX function loops ceil((limit - start) / delta) times); nothing behind
    a Shape or a Size, which read only the shape.  A floating-point tensor of more than one
    element is planned on only where it feeds such a place directly."""
    from polyc.frontends.onnx.ops import converter_for

    producers = {output: flat.proto for flat in flat_nodes for output in flat.proto.output if output}
    found, seen = set(), set()

    def trace(name: str, direct: bool, any_type: bool) -> None:
        if (name, any_type) in seen and not direct:
            return
        seen.add((name, any_type))
        if name in inputs:
            info = inputs[name]
            scalar = info.shape is not None and all(d == 1 for d in info.shape)
            if direct or info.dtype.kind in "iub" or (any_type and scalar):
                found.add(name)
            return
        producer = producers.get(name)
        if producer is not None and producer.op_type not in ("Shape", "Size"):
            for source in producer.input:
                if source:
                    trace(source, False, any_type)

    for flat in flat_nodes:
        node = flat.proto
        converter = converter_for(node.op_type, node.domain)
        control = node.op_type in CONSTANT_INPUTS and converter is None
        for position in getattr(converter, "CONSTANT_INPUTS", ()) or CONSTANT_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position]:
                trace(node.input[position], True, control)
    return found


#: The one onnxruntime execution provider polyc stands for: it compiles C for this machine's CPU.
CPU_PROVIDER = "CPUExecutionProvider"


def _onnxruntime_arguments(sess_options, providers, provider_options, graph_fusion: bool | None, options: dict) -> bool:
    """Check onnxruntime's session arguments and apply what polyc has a counterpart for:
    threads go into ``options`` (unless given), and the graph optimisation level decides
    ``graph_fusion`` where the caller did not.  Returns ``graph_fusion``."""
    if sess_options is not None:
        known = ("intra_op_num_threads", "graph_optimization_level")
        if not all(hasattr(sess_options, name) for name in known):
            raise PolycError(
                f"sess_options must be an onnxruntime.SessionOptions (with {' and '.join(known)}), "
                f"not {type(sess_options).__name__}"
            )
        threads = sess_options.intra_op_num_threads
        if not isinstance(threads, int) or threads < 0:
            raise PolycError(f"sess_options.intra_op_num_threads must be an integer >= 0, not {threads!r}")
        if threads > 0:
            options.setdefault("threads", threads)
        level = sess_options.graph_optimization_level
        if graph_fusion is None and getattr(level, "name", str(level)) == "ORT_DISABLE_ALL":
            graph_fusion = False
        if getattr(sess_options, "enable_profiling", False):
            warnings.warn(
                "sess_options.enable_profiling: polyc writes no onnxruntime profile; "
                "InferenceSession.profile(feeds) times each kernel",
                PolycWarning,
                stacklevel=3,
            )
        if getattr(sess_options, "optimized_model_filepath", ""):
            warnings.warn(
                "sess_options.optimized_model_filepath: polyc writes no optimized ONNX model; "
                "InferenceSession.tc_source() gives the kernels it compiled",
                PolycWarning,
                stacklevel=3,
            )
    names = _provider_names(providers)
    if provider_options is not None and (
        not isinstance(provider_options, (list, tuple)) or providers is None or len(provider_options) != len(names)
    ):
        raise PolycError("provider_options must be a list of one dict per provider in providers")
    others = [name for name in names if name != CPU_PROVIDER]
    if others:
        warnings.warn(
            f"polyc computes on the CPU (as {CPU_PROVIDER}); the provider(s) {', '.join(map(repr, others))} "
            "are not used",
            PolycWarning,
            stacklevel=3,
        )
    return True if graph_fusion is None else graph_fusion


def _provider_names(providers) -> list[str]:
    """The names in onnxruntime's ``providers`` argument: names or (name, options) pairs."""
    if providers is None:
        return []
    if isinstance(providers, str) or not isinstance(providers, (list, tuple)):
        raise PolycError(
            f"providers must be a list of provider names (or (name, options) pairs), not {type(providers).__name__}"
        )
    names = []
    for provider in providers:
        if isinstance(provider, tuple) and len(provider) == 2 and isinstance(provider[0], str):
            provider = provider[0]
        if not isinstance(provider, str):
            raise PolycError(
                f"providers must be a list of provider names (or (name, options) pairs); {provider!r} is neither"
            )
        names.append(provider)
    return names
