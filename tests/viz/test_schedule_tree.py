"""polyc.viz.schedule_tree: the diagram's nodes are isl's (walked independently here), its bands
point at the loops polyc generated for them, and it renders as text and well-formed HTML."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import islpy as isl
import pytest

import polyc
from polyc.viz import schedule_tree
from polyc.viz.schedule_tree import ScheduleTreeView
from tests.viz.sources import MATMUL, SHIFTED  # noqa: E402

SIZES = {"M": 16, "K": 12, "N": 8}


@pytest.fixture(scope="module")
def loop_nest():
    # A plain tiled nest (a register tile adds bands of its own: tests/test_register_tiles.py).
    return polyc.define(MATMUL, blas_contractions=False, loop_tiles=(4, 4, 4), register_tiles=()).mm


def isl_bands(node: isl.ScheduleNode, found: list) -> list:
    """(schedule depth, members, permutable, coincident) of every band, depth first."""
    if node.get_type() == isl.schedule_node_type.band:
        n = node.band_n_member()
        found.append(
            (
                node.get_schedule_depth(),
                n,
                bool(node.band_get_permutable()),
                [bool(node.band_member_get_coincident(i)) for i in range(n)],
            )
        )
    for i in range(node.n_children()):
        isl_bands(node.child(i), found)
    return found


class _Checker(HTMLParser):
    """Fails on unbalanced tags; collects ids."""

    VOID = {"br", "hr", "img", "input", "meta", "link"}

    def __init__(self):
        super().__init__()
        self.stack, self.ids = [], []

    def handle_starttag(self, tag, attrs):
        self.ids += [v for k, v in attrs if k == "id"]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"


def test_bands_are_isls_and_point_at_their_loops(loop_nest):
    tree = schedule_tree(loop_nest, SIZES)
    stages = loop_nest.stages(SIZES)
    expected = isl_bands(stages.optimized_schedule.get_root(), [])
    bands = tree.bands()
    assert [(b.depth, len(b.members), b.permutable, b.coincident) for b in bands] == expected
    assert [loop for b in bands for loop in b.loops] == [f"c{d}" for d in range(6)]
    # Each band's loops are loop headers of the generated C, in the nest's order.
    headers = re.findall(r"for \(int64_t (c\d+) = ", stages.kernel.source)
    assert headers == [loop for b in bands for loop in b.loops]
    page = tree.html()
    for band in bands:
        assert f'data-loops="{" ".join(band.loops)}"' in page
    assert len(re.findall(r'class="pt-line" data-loop="c\d+"', page)) == 6
    # The marks polyc put on the tree are nodes of their own.
    marks = [n.label for n in tree.root.walk() if n.kind == "mark"]
    assert any(m.startswith("mark: parallel@") for m in marks) and any(m.startswith("mark: simd@") for m in marks)


def test_a_sequence_of_two_statements():
    kernel = polyc.define(SHIFTED, fusion="min").shifted
    tree = schedule_tree(kernel, {"N": 8})
    sequences = [n for n in tree.root.walk() if n.kind == "sequence"]
    assert sequences
    filters = [child.label for child in sequences[0].children]
    names = [s.name for s in kernel.stages({"N": 8}).program.statements]
    assert filters == [f"filter: {name}" for name in names] == ["filter: S0", "filter: S1"]
    text = str(tree)
    assert "sequence: children run in this order" in text and text.index("filter: S0") < text.index("filter: S1")


def test_the_gemm_path_shows_isls_code_and_the_packing_blocks():
    kernel = polyc.define(MATMUL).mm
    stages = kernel.stages({"M": 64, "K": 64, "N": 64})
    assert stages.contraction is not None
    tree = schedule_tree(kernel, {"M": 64, "K": 64, "N": 64})
    assert "loop nest shown is isl's code" in tree.code_note
    assert "for (int c0 = " in tree.code
    assert len(tree.parts) == len(stages.packing) > 0
    assert all({"PackA", "PackB", "Kernel"} <= set(p.root.label.split(": ")[1].split(", ")) for p in tree.parts)


def test_html_is_well_formed_and_ids_are_unique(loop_nest, tmp_path):
    first, second = schedule_tree(loop_nest, SIZES), schedule_tree(loop_nest, SIZES)
    checker = _Checker()
    checker.feed(first.html() + second.html())
    assert checker.stack == [] and len(checker.ids) == len(set(checker.ids)) == 2
    first.save(tmp_path / "tree.html")
    assert (tmp_path / "tree.html").read_text().startswith("<!DOCTYPE html>")
    assert first._repr_html_().count('class="polyc-tree"') == 1


def test_any_schedule_and_bad_sizes(loop_nest):
    ctx = isl.Context()
    schedule = isl.Schedule.from_domain(isl.UnionSet.read_from_str(ctx, "{ S[i, j] : 0 <= i, j < 4 }"))
    schedule = schedule.insert_partial_schedule(isl.MultiUnionPwAff.read_from_str(ctx, "[{ S[i, j] -> [(j)] }]"))
    view = ScheduleTreeView.from_schedule(schedule)
    assert [b.members for b in view.bands()] == [["S: j"]] and "for (int c0 = 0; c0 <= 3; c0 += 1)" in view.code
    with pytest.raises(polyc.PolycError):
        schedule_tree(loop_nest, {"M": 4})
