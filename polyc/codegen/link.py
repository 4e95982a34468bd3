"""One translation unit from the kernels of a def's segments (:mod:`polyc.schedule.segments`).

Every generated kernel is a complete translation unit: the prelude, its own file-scope helpers
(``static`` functions, types, macros: the gemm back end's packing routines and micro-kernels,
say) and its entry function.  To run segments in one call they are joined into one unit:

* the prelude once;
* each segment's text without its prelude, with every name it defines at file scope given the
  segment's prefix (``polyc_pack_a_6x64`` -> ``polyc_p1_pack_a_6x64``, ``POLYC_HAS_EPILOGUE``
  -> ``POLYC_P1_HAS_EPILOGUE``), so that two gemm segments do not clash, and its entry
  function made ``static``;
* an entry function with the def's signature calling them in order, stopping at the first that
  returns a non-zero status.

The result is an ordinary kernel (a :class:`~polyc.codegen.pattern_kernel.DedicatedKernel`,
whose decisions say how the def was cut): cached, loaded and exported like any other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from polyc.codegen.c import _C_KEYWORDS, GeneratedKernel
from polyc.codegen.c_expr import PRELUDE, c_type
from polyc.codegen.pattern_kernel import DedicatedKernel
from polyc.lang import checked as ir

# Names a segment defines at file scope: functions (the name before the parameter list on a line
# starting a definition), typedef'd structs, macros.
_FUNCTION = re.compile(r"^(?:static\s+)?(?:inline\s+)?(?:const\s+)?[A-Za-z_][\w ]*?[\s*](polyc_\w+)\s*\(", re.M)
_TYPEDEF = re.compile(r"^}\s*(polyc_\w+)\s*;|^typedef\s+struct\s*\{[^}]*\}\s*(polyc_\w+)\s*;", re.M)
_MACRO = re.compile(r"^#\s*define\s+((?:polyc|POLYC)_\w+)", re.M)


def link_segments(
    name: str,
    definition: ir.CheckedDef,
    parts: list[GeneratedKernel],
    size_arguments: tuple[str, ...],
    decisions: Mapping[str, Any] | None = None,
) -> DedicatedKernel:
    """The kernel ``polyc_<name>`` running ``parts`` in order; its arguments are
    ``definition``'s tensors (inputs, outputs, temporaries, as the generic back end orders
    them) and ``size_arguments``; ``decisions``: how the def was cut (its
    :attr:`~polyc.codegen.pattern_kernel.DedicatedKernel.decisions`)."""
    function = f"polyc_{name}"
    order = [
        t for role in (ir.Role.INPUT, ir.Role.OUTPUT, ir.Role.TEMPORARY) for t in definition.tensors if t.role is role
    ]
    tensor_names = {t.name for t in definition.tensors}
    size_c = {s: f"{s}_size" for s in size_arguments if s in tensor_names or s in _C_KEYWORDS}  # as c.py
    pieces = [
        f"/*\n * polyc kernel for def '{definition.name}', in {len(parts)} segments run in order:\n"
        + "".join(f" *   segment {k}: {_first_line(part.source)}\n" for k, part in enumerate(parts))
        + " */",
        PRELUDE,
    ]
    calls = []
    for k, part in enumerate(parts):
        text, entry = _namespaced(part, f"p{k}")
        pieces += [f"/* ======== segment {k} ======== */", text]
        if not set(part.size_arguments) <= set(size_arguments):
            raise AssertionError(f"segment {k} of {name} takes sizes {part.size_arguments}")
        arguments = list(part.tensor_arguments) + [size_c.get(s, s) for s in part.size_arguments]
        calls.append(f"    if ((polyc_status = {entry}({', '.join(arguments)})) != 0) return polyc_status;")
    parameters = [
        f"{'const ' if t.role is ir.Role.INPUT else ''}{c_type(t.dtype)} *__restrict__ {t.name}" for t in order
    ]
    parameters += [f"int64_t {size_c.get(s, s)}" for s in size_arguments]
    pieces += [
        "/* ======== the def: its segments in order ======== */",
        f"int {function}({', '.join(parameters)})\n{{\n    int polyc_status;\n"
        + "\n".join(calls)
        + "\n    return 0;\n}\n",
    ]
    return DedicatedKernel(
        function, "\n".join(pieces), tuple(t.name for t in order), size_arguments, (), dict(decisions or {})
    )


def _first_line(source: str) -> str:
    """The kernel's description: the first line of its header comment."""
    for line in source.splitlines():
        line = line.strip(" /*")
        if line:
            return line
    return ""


def _namespaced(part: GeneratedKernel, prefix: str) -> tuple[str, str]:
    """``part``'s source without the prelude, its file-scope names prefixed, its entry function
    static; and the entry function's new name."""
    if PRELUDE not in part.source:
        raise AssertionError(f"{part.function_name}: generated source without the prelude")
    text = part.source.replace(PRELUDE, "", 1)
    names = {m.group(1) for m in _FUNCTION.finditer(text)}
    names |= {m.group(1) or m.group(2) for m in _TYPEDEF.finditer(text)}
    names |= {m.group(1) for m in _MACRO.finditer(text)}
    names.add(part.function_name)

    def renamed(name: str) -> str:
        lead, rest = name.split("_", 1)
        return f"{lead}_{prefix if lead == 'polyc' else prefix.upper()}_{rest}"

    if names:
        pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")\b")
        text = pattern.sub(lambda m: renamed(m.group(1)), text)
    entry = renamed(part.function_name)
    text = re.sub(rf"^int {entry}\(", f"static int {entry}(", text, count=1, flags=re.M)
    return text, entry
