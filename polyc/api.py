"""The Python API: ``polyc.define(source)`` gives a module with one callable kernel per def.

>>> import numpy as np, polyc
>>> mod = polyc.define('''
... def matmul(float(M, K) A, float(K, N) B) -> (C) {
...     C(m, n) +=! A(m, r_k) * B(r_k, n)
... }''')
>>> A = np.ones((2, 3), np.float32); B = np.ones((3, 4), np.float32)
>>> mod.matmul(A, B)[0, 0]
3.0
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from polyc.errors import PolycError
from polyc.interpreter import run_bound
from polyc.ir.model import build_program
from polyc.lang import ast
from polyc.lang.checked import CheckedDef
from polyc.lang.float16_sums import accumulate_float16_in_float32
from polyc.lang.parser import parse
from polyc.lang.sema import check_def
from polyc.options import GPU_BACKENDS, Options, options_reference
from polyc.runtime.arguments import bind_arguments
from polyc.runtime.proofs import define_proofs
from polyc.target import Target


class Kernel:
    """One def of a module: call it with numpy arrays; inspect each stage of its compilation."""

    def __init__(self, syntax: ast.Def, definition: CheckedDef, options: Options):
        self.syntax = syntax
        self.definition = definition
        self.options = options
        # Prove affine accesses in bounds now: always-wrong ones fail at define time, the rest
        # leave a precondition on the sizes that every call checks.  An earlier process's
        # findings for the same text come from the kernel cache (polyc.runtime.proofs).
        proofs = define_proofs(definition)
        self.bounds_precondition = proofs.bounds
        self._written_before_read = proofs.written_before_read
        self._shape_memo: dict = {}  # size signature -> every tensor's shape
        self._sizes_checked: set[tuple[int, ...]] = set()
        self._backend = _make_backend(definition, options)
        # Input signature -> RepeatCall, for calls whose inputs match one already checked.  Not
        # when a size is bound to a 0-d input's value: the signature would not determine it.
        self._repeat_calls: dict = {}
        self._repeatable = hasattr(self._backend, "repeat_plan") and all(
            binding.dim is not None for binding in definition.size_bindings
        )

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def written_before_read(self) -> frozenset[str]:
        """The outputs and temporaries the kernel writes whole before it reads any of them (the
        others must start as zeros), as the define-time proofs found."""
        return frozenset(self._written_before_read)

    def __call__(self, *args, outputs=None):
        """Run on ``args`` (numpy arrays; Python or numpy scalars for 0-d inputs).

        Returns the output array, or a tuple of all outputs in declared order when there are
        several.  ``outputs=[...]`` passes pre-allocated outputs, which are updated in place
        (statements without ``!`` accumulate into them).  Inputs are never modified.  With
        ``backend="opencl"``/``"cuda"``, inputs may be the runtime's device arrays (pyopencl
        ``Array``, pycuda ``GPUArray``): they are used in place and the outputs are device arrays.
        """
        device_call = getattr(self._backend, "device_call", None)
        if device_call is not None and any(_is_device_array(a) for a in args):
            results = device_call(tuple(args), outputs, self._check_sizes_once)
            return results[0] if len(results) == 1 else results
        repeat_key = _input_signature(args) if self._repeatable else None
        repeat = self._repeat_calls.get(repeat_key) if repeat_key is not None else None
        if repeat is not None and (outputs is None or repeat.outputs_fit(args, outputs)):
            results = repeat(args, outputs)
            return results[0] if len(results) == 1 else results
        call = bind_arguments(self.definition, args, outputs, self._written_before_read, self._shape_memo)
        signature = tuple(call.sizes[s] for s in self.definition.sizes)
        if signature not in self._sizes_checked:
            self.bounds_precondition.check(call.sizes, self.definition.source or None)
            self._sizes_checked.add(signature)
        results = self._backend(call)
        if repeat_key is not None and repeat is None and len(self._repeat_calls) < _REPEAT_CALLS:
            self._repeat_calls[repeat_key] = self._backend.repeat_plan(call)
        return results[0] if len(results) == 1 else results

    def repeat_call(self, args: tuple, outputs):
        """The resolved call (:class:`polyc.driver.RepeatCall`) that ``self(*args, outputs=outputs)``
        takes, when arguments of this signature have been called before and ``outputs`` fit;
        else None.  For callers that run the same kernels on the same memory again and again (an
        ONNX plan) and keep its pointers."""
        repeat_key = _input_signature(args) if self._repeatable else None
        repeat = self._repeat_calls.get(repeat_key) if repeat_key is not None else None
        return repeat if repeat is not None and repeat.outputs_fit(args, outputs) else None

    def _check_sizes_once(self, sizes: dict) -> None:
        signature = tuple(sizes[s] for s in self.definition.sizes)
        if signature not in self._sizes_checked:
            self.bounds_precondition.check(sizes, self.definition.source or None)
            self._sizes_checked.add(signature)

    def describe(self) -> str:
        """The checked definition: shapes of all tensors, and every statement's index ranges."""
        return self.definition.describe()

    # Each stage of the compiled pipeline, for the given sizes (None: parametric, for all sizes).
    def stages(self, sizes: dict | None = None, **option_changes):
        """Every intermediate result of compilation (:class:`polyc.driver.Stages`), with the
        kernel's options changed by ``option_changes`` (say ``cache_sizes=`` for another machine)."""
        from polyc.driver import compile_stages

        options = self.options.replace(**option_changes) if option_changes else self.options
        if sizes is None:
            return compile_stages(self.definition, options.replace(specialize=False), None)
        sizes = self._checked_sizes(sizes)
        if not option_changes:  # as a call compiles it: with the best tuning record, if any
            from polyc.runtime.tuning_records import tuned_options

            return compile_stages(self.definition, tuned_options(self.definition, options, sizes), sizes, None, options)
        return compile_stages(self.definition, options, sizes)

    def library_to_build(self, sizes: dict, name: str = ""):
        """The C source and compiler options of the library a call at ``sizes`` will load,
        generated now, or None when nothing is left to build (see
        :func:`polyc.driver.build_ahead`, which builds several kernels' at once); always None
        with a GPU back end.  ``name``: what the log calls the kernel (default: its def's name)."""
        library_to_build = getattr(self._backend, "library_to_build", None)
        return library_to_build(self._checked_sizes(sizes), name) if library_to_build is not None else None

    def _forget_compiled(self) -> None:
        """Make the next call of every size look up its compiled function and options again."""
        self._repeat_calls.clear()
        forget = getattr(self._backend, "forget_compiled", None)
        if forget is not None:
            forget()

    def _checked_sizes(self, sizes: dict) -> dict[str, int]:
        """``sizes`` for every size of the def, as non-negative ints, meeting the bounds precondition."""
        names = self.definition.sizes
        if not isinstance(sizes, Mapping):
            raise PolycError(
                f"{self.name}: sizes must be a mapping of size names to integers "
                f"(such as {{{', '.join(f'{n!r}: 8' for n in names)}}}), not {type(sizes).__name__}"
            )
        unknown = sorted(set(sizes) - set(names))
        missing = [n for n in names if n not in sizes]
        if unknown or missing:
            raise PolycError(
                f"{self.name}: sizes must name exactly {', '.join(names) or 'no sizes'}"
                + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                + (f"; missing: {', '.join(missing)}" if missing else "")
            )
        checked = {}
        for name in names:
            value = sizes[name]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise PolycError(f"{self.name}: size {name} must be a non-negative integer, not {value!r}")
            checked[name] = int(value)
        self.bounds_precondition.check(checked, self.definition.source or None)
        return checked

    def explain(self, sizes: dict):
        """What polyc did with every loop at ``sizes`` and why (:mod:`polyc.viz.explain`): an
        object that prints as text and displays as a table in a notebook."""
        from polyc.viz.explain import explain

        return explain(self, self._checked_sizes(sizes))

    def check_schedule(self, schedule, sizes: dict | None = None, strict: bool = False):
        """Whether a schedule of your own (isl text such as ``"{ S0[m, n, r_k] -> [r_k, m, n] }"``)
        respects every dependence of this def; if not, the violated ones with witness pairs.
        A reduction's updates may be reordered unless ``strict`` (:func:`polyc.viz.check_schedule`);
        a schedule it accepts compiles with ``polyc.define(..., schedule=...)``."""
        from polyc.viz.explain import check_schedule

        return check_schedule(self, schedule, self._checked_sizes(sizes) if sizes else None, strict)

    def isl_model_text(self, sizes: dict | None = None) -> str:
        """Domains and accesses of every statement, and the dependences, as isl text; for a
        contraction compiled as a gemm kernel, also the packing statements of one cache block
        (:mod:`polyc.schedule.packing`) for each register block the kernel has."""
        stages = self.stages(sizes)
        parts = [stages.program.to_isl_text(), "dependences:", stages.dependences.to_text()]
        parts += [packing.to_isl_text() for packing in stages.packing]
        return "\n".join(parts)

    def schedule_text(self, sizes: dict | None = None) -> str:
        """The optimised schedule tree (tiles, marks) in isl's YAML-like notation."""
        return str(self.stages(sizes).optimized_schedule)

    def c_source(self, sizes: dict | None = None) -> str:
        """The generated C translation unit (specialised to ``sizes`` when given)."""
        return self.stages(sizes).kernel.source

    def gpu_source(self, sizes: dict, dialect: str | None = None) -> str:
        """The GPU code of this kernel at ``sizes``: one kernel function per launch, in
        ``dialect`` (``"opencl"`` or ``"cuda"``; default: the backend's, else OpenCL), with the
        mapping of each launch (grid, block, which loop runs along x, y, z) in comments."""
        return self.gpu_stages(sizes, dialect).gpu_source.source

    def gpu_stages(self, sizes: dict, dialect: str | None = None):
        """:meth:`stages` of the GPU pipeline at ``sizes``: ``.gpu`` holds the launches and their
        mapping (``.gpu.describe()``), ``.gpu_source`` the code and launch configurations."""
        from polyc.codegen.gpu import DIALECTS
        from polyc.driver import compile_gpu_stages

        dialect = dialect or (self.options.backend if self.options.backend in GPU_BACKENDS else "opencl")
        if dialect not in DIALECTS:
            raise PolycError(f"unknown GPU dialect {dialect!r}; the dialects are: {', '.join(DIALECTS)}")
        from polyc.driver import analyse

        checked = self._checked_sizes(sizes)
        options = self.options.replace(specialize=True)
        analysis = analyse(self.definition, options.fusion)
        program = build_program(self.definition, checked, ctx=analysis.program.ctx)
        return compile_gpu_stages(program, analysis.dependences, analysis.schedule, options, dialect)

    def export_c(self, directory, sizes: dict | None = None, target: str = "neon", name: str | None = None):
        """Write this kernel as ``NAME.c`` (self-contained C: no Python needed) and ``NAME.h``
        (prototype; arguments, dtypes and shapes in a comment) into ``directory``, for ``target``
        (``host``, ``avx512``, ``avx2``, ``generic`` or ``neon``; see :mod:`polyc.target`).
        ``sizes`` (all of them) specialises the kernel; None passes them as arguments.
        ``name`` defaults to the def's name.  Returns the paths ``(c_path, h_path)``."""
        return self.exported_c(sizes, target, name).write(directory)

    def exported_c(self, sizes: dict | None = None, target: str | Target = "neon", name: str | None = None):
        """:meth:`export_c`'s two files as text (:class:`polyc.runtime.targets.ExportedC`), not written."""
        from polyc.runtime.targets import export_c, export_sizes
        from polyc.target import get_target

        chosen = get_target(target)
        sizes = export_sizes(self.definition, sizes)
        if sizes is not None:
            self.bounds_precondition.check(sizes, self.definition.source or None)
        changes = {} if chosen.cache_sizes is None else {"cache_sizes": chosen.cache_sizes}
        return export_c(self.stages(sizes, **changes), chosen, name)

    def __repr__(self) -> str:
        return (
            f"<polyc kernel {self.definition.name}: {len(self.definition.inputs)} input(s), "
            f"{len(self.definition.outputs)} output(s)>"
        )


#: The most input signatures a kernel remembers a RepeatCall for.
_REPEAT_CALLS = 64


def _input_signature(args: tuple) -> tuple | None:
    """Shape and dtype of each argument when every one is a C-contiguous ndarray (not a
    subclass, not a scalar) in the machine's byte order, else None: arguments with the signature
    of a call that passed :func:`bind_arguments` need no checks and no copies."""
    signature = []
    for value in args:
        if type(value) is not np.ndarray or not value.flags.c_contiguous or not value.dtype.isnative:
            return None
        signature.append((value.shape, value.dtype))
    return tuple(signature)


def _is_device_array(value) -> bool:
    """A GPU runtime's array (pyopencl, pycuda): the GPU back ends use it in place."""
    return type(value).__module__.startswith(("pyopencl", "pycuda"))


def _make_backend(definition: CheckedDef, options: Options):
    if options.backend == "interpreter":
        return lambda call: run_bound(definition, call)
    if options.backend in GPU_BACKENDS:
        from polyc.driver import gpu_code_generator
        from polyc.runtime.gpu import GpuCompiledKernel

        return GpuCompiledKernel(definition, options, gpu_code_generator(definition, options))
    from polyc.driver import CompiledKernel  # the polyhedral pipeline; imported lazily (isl, cgen)

    return CompiledKernel(definition, options)


class Module:
    """The kernels of one TC source, as attributes named after their defs."""

    def __init__(self, kernels: dict[str, Kernel], source: ast.SourceFile):
        self._kernels = kernels
        self.source = source

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(f"no def named '{name}' in this source (defs: {', '.join(kernels) or 'none'})")

    def __getitem__(self, name: str) -> Kernel:
        return getattr(self, name)

    def __dir__(self):
        return list(super().__dir__()) + list(self._kernels)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kernels)

    def __repr__(self) -> str:
        return f"<polyc module: {', '.join(self._kernels)}>"


def _check_loop_order(definitions: list[CheckedDef], loop_order: tuple[str, ...] | None) -> None:
    """Every name in ``loop_order`` must be an index of a def of the module (a def that has none
    of them keeps the scheduler's order, as loops the order does not name do)."""
    if loop_order is None:
        return
    known = {
        index for definition in definitions for statement in definition.statements for index in statement.all_indices
    }
    unknown = [name for name in loop_order if name not in known]
    if unknown:
        defs = ", ".join(definition.name for definition in definitions)
        raise PolycError(
            f"loop_order names {', '.join(map(repr, unknown))}: no index of {defs} "
            f"(the indices: {', '.join(sorted(known))})"
        )


def define(source: str, filename: str = "<tc>", **options) -> Module:
    """Parse and check TC ``source``; return a module with one kernel per def.

    ``filename`` names the source in error messages: errors in it raise :class:`PolycError`
    subclasses carrying ``file:line:col``.  The options (keywords, checked by
    :class:`polyc.options.Options`; an unknown one is an error naming the known ones) apply to
    every kernel of the module; each is listed below.
    """
    if not isinstance(source, str):
        raise PolycError(f"define() takes TC source text, not {type(source).__name__}")
    checked_options = Options.from_kwargs(**options)
    tree = parse(source, filename)
    definitions = [check_def(d, source, filename) for d in tree.defs]
    if checked_options.backend not in GPU_BACKENDS:
        # float16 sums in float32 (the GPU mappers keep their tiles in float16 and round each step)
        definitions = [accumulate_float16_in_float32(d) for d in definitions]
    _check_loop_order(definitions, checked_options.loop_order)
    kernels = {d.name: Kernel(d, definition, checked_options) for d, definition in zip(tree.defs, definitions)}
    return Module(kernels, tree)


# help(polyc.define) lists every option, from the one place they are described.
define.__doc__ = (define.__doc__ or "") + "\n" + options_reference("    ")
