"""The compiled schedule tree as a diagram, beside the loop nest it became.

    tree = polyc.viz.schedule_tree(kernel, {"M": 64, "K": 64, "N": 64})
    tree                     # in Jupyter: hover a band to light up its loops; click for isl text
    print(tree)              # the same as an indented text tree
    tree.save("tree.html")   # one self-contained page

Every node of isl's schedule tree is a box: bands with one line per member (its affine
schedule per statement) and their permutable/coincident flags, filters with the statements
they keep, sequences and sets with their children in order, marks (polyc's ``parallel@`` and
``simd@`` marks say which loops get OpenMP pragmas), extension, guard and context nodes.
isl names the loop of the schedule dimension ``d`` ``c<d>`` in the code it builds, and polyc's
C keeps those names, so a band at schedule depth ``d`` with ``n`` members is exactly the loops
``c<d>`` .. ``c<d+n-1>``: that is how the diagram points at code.  When the kernel went to a
hand-written gemm or convolution kernel, the loop nest shown is isl's own code for the tree,
and a gemm's packing blocks are drawn after it, one tree each.

Plain HTML, CSS and a little JavaScript: no graphviz, no network; it works in JupyterLab and
in notebooks exported to static HTML.
"""

from __future__ import annotations

import html
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from polyc.paths import kernel_path
from polyc.viz.page import write_page

_ids = itertools.count()
_LOOP_HEADER = re.compile(r"\bfor \((?:int64_t|int|long) (c\d+) = ")
_MEMBER = re.compile(r"(\w+)\[[^\]]*\] -> \[\((.*?)\)\]")

_KINDS: dict[Any, str] = {  # isl.schedule_node_type values (ints to the type checker)
    isl.schedule_node_type.band: "band",
    isl.schedule_node_type.context: "context",
    isl.schedule_node_type.domain: "domain",
    isl.schedule_node_type.expansion: "expansion",
    isl.schedule_node_type.extension: "extension",
    isl.schedule_node_type.filter: "filter",
    isl.schedule_node_type.leaf: "leaf",
    isl.schedule_node_type.guard: "guard",
    isl.schedule_node_type.mark: "mark",
    isl.schedule_node_type.sequence: "sequence",
    isl.schedule_node_type.set: "set",
}


@dataclass
class TreeNode:
    """One node of a schedule tree, with what the diagram shows of it."""

    kind: str  # band, filter, sequence, set, mark, extension, domain, leaf, ...
    label: str  # one line
    isl_text: str  # the node's own isl description
    depth: int  # schedule depth: band members above it
    members: list[str] = field(default_factory=list)  # band: per member, "S0: m - m mod 4; ..."
    permutable: bool = False
    coincident: list[bool] = field(default_factory=list)
    loops: list[str] = field(default_factory=list)  # band: the loop iterators it becomes
    children: list[TreeNode] = field(default_factory=list)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass
class ScheduleTreeView:
    """A schedule tree diagram and its loop nest; ``parts`` when a def runs in segments."""

    title: str
    root: TreeNode | None
    code: str = ""
    code_note: str = ""
    parts: list[ScheduleTreeView] = field(default_factory=list)

    @classmethod
    def from_schedule(
        cls, schedule: isl.Schedule, code: str | None = None, title: str = "", code_note: str = ""
    ) -> ScheduleTreeView:
        """The diagram of any isl schedule; ``code`` defaults to isl's own C for it."""
        if code is None:
            build = isl.AstBuild.from_context(schedule.get_domain().params())
            code = build.node_from_schedule(schedule).to_C_str()
        return cls(title, _node(schedule.get_root()), code, code_note)

    def bands(self) -> list[TreeNode]:
        return [n for n in self.root.walk() if n.kind == "band"] if self.root else []

    # ------------------------------------------------------------------ text
    def text(self) -> str:
        lines = [self.title] if self.title else []
        if self.root is not None:
            _text(self.root, 0, lines, set(_LOOP_HEADER.findall(self.code)))
        if self.code_note:
            lines.append(f"({self.code_note})")
        for part in self.parts:
            lines.append("")
            lines.append(part.text())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    # ------------------------------------------------------------------ HTML
    def html(self) -> str:
        """The diagram as an HTML fragment (a ``div``, its style and its script)."""
        view_id = f"polyc-tree-{next(_ids)}-{id(self) & 0xFFFF:x}"
        return (
            f'<div class="polyc-tree" id="{view_id}">{_STYLE}{self._body()}</div>'
            f"<script>{_SCRIPT.replace('@ID@', view_id)}</script>"
        )

    def _body(self) -> str:
        parts = [f'<div class="pt-title">{html.escape(self.title)}</div>' if self.title else ""]
        if self.root is not None:
            code_lines = []
            for line in self.code.splitlines():
                match = _LOOP_HEADER.search(line)
                loop = f' data-loop="{match.group(1)}"' if match else ""
                code_lines.append(f'<span class="pt-line"{loop}>{html.escape(line) or " "}</span>')
            note = f'<div class="pt-note">{html.escape(self.code_note)}</div>' if self.code_note else ""
            in_code = set(_LOOP_HEADER.findall(self.code))
            parts.append(
                f'<div class="pt-columns"><div class="pt-tree">{_node_html(self.root, in_code)}</div>'
                f'<div class="pt-code">{note}<pre>{"".join(code_lines)}</pre></div></div>'
            )
        parts.extend(f'<div class="pt-part">{part._body()}</div>' for part in self.parts)
        return "".join(parts)

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path) -> None:
        """Write the diagram as a self-contained HTML page."""
        write_page(path, self.title, self.html())


def schedule_tree(kernel, sizes: dict) -> ScheduleTreeView:
    """The compiled schedule tree of ``kernel`` at ``sizes`` beside its loop nest."""
    return _view(
        kernel.stages(sizes), f"{kernel.definition.name} at " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    )


def _view(stages, title: str) -> ScheduleTreeView:
    if stages.segments:
        view = ScheduleTreeView(f"{title}: {len(stages.segments)} segments, each compiled on its own", None)
        view.parts = [_view(part, f"segment {number}") for number, part in enumerate(stages.segments)]
        return view
    path = kernel_path(stages.path)
    if not path.runs_schedule_loops:
        view = ScheduleTreeView.from_schedule(
            stages.optimized_schedule,
            title=title,
            code_note=f"this def runs polyc's {path.name.replace('_', ' ')} kernel; the loop nest shown is "
            "isl's code for the tree",
        )
        view.parts = [
            ScheduleTreeView.from_schedule(
                block.schedule, title=f"packing and micro-kernel order of one {block.mr}x{block.nr} register block"
            )
            for block in stages.packing
        ]
        return view
    source = stages.kernel.source
    marker = "end of polyc prelude"
    code = source.split(marker, 1)[1].split("\n", 1)[1] if marker in source else source
    return ScheduleTreeView.from_schedule(stages.optimized_schedule, code=code.strip("\n"), title=title)


def _node(node: isl.ScheduleNode) -> TreeNode:
    kind = _KINDS.get(node.get_type(), str(node.get_type()))
    depth = node.get_schedule_depth()
    result = TreeNode(kind, kind, "", depth)
    if kind == "band":
        n = node.band_n_member()
        partial = node.band_get_partial_schedule()
        result.members = [_member_text(partial.get_at(i)) for i in range(n)]
        result.permutable = bool(node.band_get_permutable())
        result.coincident = [bool(node.band_member_get_coincident(i)) for i in range(n)]
        result.loops = [f"c{depth + i}" for i in range(n)]
        flags = (["permutable"] if result.permutable else []) + (
            [f"coincident: {', '.join(l for l, c in zip(result.loops, result.coincident) if c)}"]
            if any(result.coincident)
            else []
        )
        result.label = f"band: loops {', '.join(result.loops)}" + (f" ({'; '.join(flags)})" if flags else "")
        result.isl_text = str(partial)
    elif kind == "filter":
        kept = node.filter_get_filter()
        result.isl_text = str(kept)
        result.label = "filter: " + ", ".join(_statement_names(kept))
    elif kind == "mark":
        result.label = f"mark: {node.mark_get_id().get_name()}"
        result.isl_text = result.label
    elif kind == "domain":
        domain = node.domain_get_domain()
        result.isl_text = str(domain)
        result.label = "domain: " + ", ".join(_statement_names(domain))
    elif kind == "extension":
        result.isl_text = str(node.extension_get_extension())
        result.label = "extension: instances added by the schedule (e.g. copies)"
    elif kind == "context":
        result.isl_text = str(node.context_get_context())
        result.label = "context"
    elif kind == "guard":
        result.isl_text = str(node.guard_get_guard())
        result.label = "guard"
    elif kind in ("sequence", "set"):
        result.label = f"{kind}: children run {'in this order' if kind == 'sequence' else 'in any order'}"
        result.isl_text = result.label
    result.children = [_node(node.child(i)) for i in range(node.n_children())] if kind != "leaf" else []
    return result


def _member_text(member: isl.UnionPwAff) -> str:
    """'S0: m - (m) mod 4; S0_init: ...' from a band member's affine schedule."""
    text = str(member)
    found = _MEMBER.findall(text)
    return "; ".join(f"{name}: {expression}" for name, expression in found) if found else text


def _statement_names(union_set) -> list[str]:
    names: list[str] = []
    union_set.foreach_set(lambda s: names.append(s.get_tuple_name()))
    return sorted(names)


def _text(node: TreeNode, indent: int, lines: list[str], in_code: set) -> None:
    if node.kind == "leaf":
        return
    lines.append("  " * indent + node.label)
    for loop, member, coincident in zip(node.loops, node.members, node.coincident):
        lines.append(
            "  " * indent
            + f"  | {member}"
            + ("  [coincident]" if coincident else "")
            + ("" if loop in in_code else "  [one iteration: no loop in the code]")
        )
    for child in node.children:
        _text(child, indent + 1, lines, in_code)


def _node_html(node: TreeNode, in_code: set) -> str:
    """``in_code``: the loops the code has (isl writes no loop for a member that takes one value)."""
    if node.kind == "leaf":
        return ""
    attributes = f' data-loops="{" ".join(node.loops)}"' if node.loops else ""
    members = "".join(
        f'<div class="pt-member"><code>{html.escape(loop)}</code> {html.escape(member)}'
        + (' <span class="pt-flag">coincident</span>' if coincident else "")
        + ("" if loop in in_code else ' <span class="pt-once">one iteration at these sizes: no loop in the code</span>')
        + "</div>"
        for loop, member, coincident in zip(node.loops, node.members, node.coincident)
    )
    children = "".join(_node_html(child, in_code) for child in node.children)
    layout = " pt-row" if node.kind == "set" else ""
    return (
        f'<div class="pt-node pt-{node.kind}"{attributes} title="{html.escape(node.isl_text)}">'
        f'<details><summary><span class="pt-kind">{html.escape(node.label)}</span></summary>'
        f"<pre>{html.escape(node.isl_text)}</pre></details>{members}"
        + (f'<div class="pt-children{layout}">{children}</div>' if children else "")
        + "</div>"
    )


_STYLE = """<style>
.polyc-tree { font: 12px sans-serif; }
.polyc-tree .pt-title { font-weight: bold; margin: 4px 0; }
.polyc-tree .pt-columns { display: flex; gap: 12px; align-items: flex-start; }
.polyc-tree .pt-tree { flex: 1 1 50%; min-width: 0; }
.polyc-tree .pt-code { flex: 1 1 50%; min-width: 0; }
.polyc-tree .pt-code pre { margin: 0; padding: 6px; background: #f7f7f7; border: 1px solid #ddd;
  overflow-x: auto; font: 11px/1.35 monospace; white-space: pre; }
.polyc-tree .pt-once { color: #888; font-family: sans-serif; }
.polyc-tree .pt-line { display: block; }
.polyc-tree .pt-line[data-loop] { font-weight: bold; }
.polyc-tree .pt-line.pt-hot { background: #ffe082; }
.polyc-tree .pt-node { border: 1px solid #b0bec5; border-radius: 4px; margin: 3px 0; padding: 2px 6px;
  background: #fff; }
.polyc-tree .pt-band { border-color: #1565c0; background: #e3f2fd; cursor: pointer; }
.polyc-tree .pt-band.pt-hot { outline: 2px solid #f9a825; }
.polyc-tree .pt-filter { border-color: #ef6c00; background: #fff3e0; }
.polyc-tree .pt-mark { border-color: #6a1b9a; background: #f3e5f5; }
.polyc-tree .pt-sequence, .polyc-tree .pt-set { border-style: dashed; }
.polyc-tree .pt-extension { border-color: #2e7d32; background: #e8f5e9; }
.polyc-tree .pt-children { margin-left: 10px; }
.polyc-tree .pt-row { display: flex; gap: 6px; }
.polyc-tree .pt-member { font-family: monospace; font-size: 11px; margin-left: 8px; }
.polyc-tree .pt-flag { color: #2e7d32; font-family: sans-serif; }
.polyc-tree .pt-note { color: #555; margin-bottom: 4px; }
.polyc-tree details > pre { white-space: pre-wrap; font-size: 10px; margin: 2px 0; }
.polyc-tree summary { cursor: pointer; }
.polyc-tree .pt-part { margin-top: 10px; border-top: 1px solid #ddd; }
</style>"""

# Hovering a band lights up its loops in the code beside it; clicking pins the highlight.
_SCRIPT = r"""
(function () {
  var root = document.getElementById("@ID@");
  if (!root || root.getAttribute("data-polyc-wired")) return;
  root.setAttribute("data-polyc-wired", "1");
  root.querySelectorAll(".pt-columns").forEach(function (columns) {
    var lines = columns.querySelectorAll(".pt-line[data-loop]"), lit = null, pinned = null;
    function light(band) {
      if (band === lit) return;
      var loops = band ? (band.getAttribute("data-loops") || "").split(" ") : [];
      if (lit) lit.classList.remove("pt-hot");
      if (band) band.classList.add("pt-hot");
      lines.forEach(function (line) {
        line.classList.toggle("pt-hot", loops.indexOf(line.getAttribute("data-loop")) >= 0);
      });
      lit = band;
    }
    columns.addEventListener("mouseover", function (e) {
      if (!pinned) light(e.target.closest(".pt-band"));
    });
    columns.addEventListener("mouseleave", function () { if (!pinned) light(null); });
    columns.addEventListener("click", function (e) {
      var band = e.target.closest(".pt-band");
      if (!band) return;
      pinned = pinned === band ? null : band;
      light(band);
    });
  });
  root.setAttribute("data-polyc-drawn", "1");
})();
"""
