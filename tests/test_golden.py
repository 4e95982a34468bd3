"""Golden tests: every stage of the pipeline for a few defs, compared with stored text.

For each case, once specialised to sizes of 64 and once parametric, with default options, five
texts are compared with files under ``tests/golden/<case>/<variant>/``:

    model.txt                  domains and accesses (PolyProgram.to_isl_text)
    dependences.txt            flow, anti, output and reduction dependences (Dependences.to_text)
    schedule.yaml              the isl scheduler's tree (compute_schedule)
    optimized_schedule.yaml    after tiling, reordering and marks (optimize_schedule)
    kernel.c                   the generated C

After a deliberate change, read the diff a failure shows, then rewrite the files with

    python -m pytest tests/test_golden.py --update-goldens

and review ``git diff tests/golden`` before committing.  The semantic tests at the end check
what must hold whatever the goldens say (parallel and reduction dependences, fusion, pragmas).

The texts are normalised so that they depend on polyc, not on the machine or on isl's internals:
the cache model behind automatic tile sizes is pinned, pieces of an isl union are sorted (isl
prints them in hash-table order), pointer addresses isl may print after an id are dropped, and
the C prelude (tested with polyc/codegen/c_expr.py) is replaced by one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path

import islpy as isl
import pytest

import polyc
import polyc.target
from polyc.codegen.c_expr import PRELUDE
from polyc.schedule import tiling

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

MATMUL = """\
def matmul(float(M, K) A, float(K, N) B) -> (C) {
    C(m, n) +=! A(m, r_k) * B(r_k, n)
}"""

# A producer and its consumer, element for element: fusable without losing parallelism.
SCALE_SHIFT = """\
def scale_shift(float(M, N) A) -> (C) {
    B(i, j) = A(i, j) * 2
    C(i, j) = B(i, j) + 1
}"""

# A matmul and its epilogue (bias, ReLU) reading the finished sums.
MLP = """\
def mlp(float(M, K) I, float(K, N) W, float(N) b) -> (O) {
    O(i, j) +=! I(i, r_k) * W(r_k, j)
    O(i, j) = fmax(O(i, j) + b(j), 0)
}"""

# Row-wise reductions and elementwise passes: one parallel loop over the rows, vectorised
# reductions inside it, polyc's own expf.
SOFTMAX = """\
def softmax(float(N, D) X) -> (O) {
    M(n) max=! X(n, r_d)
    O(n, d) = exp(X(n, d) - M(n))
    S(n) +=! O(n, r_d)
    O(n, d) = O(n, d) / S(n)
}"""

CASES = {"matmul": MATMUL, "scale_shift": SCALE_SHIFT, "mlp": MLP, "softmax": SOFTMAX}
VARIANTS = ("sizes64", "parametric")

#: The cache model tile sizes are chosen with (the defaults polyc assumes without sysfs), so
#: that the goldens do not depend on the machine that runs the tests.
PINNED_CACHE_SIZES = {1: 32 * 1024, 2: 1024 * 1024, 3: 8 * 1024 * 1024}


#: The cores the tile model leaves a parallel tile for (tiling._leave_tiles_for_threads).
PINNED_CORES = 2


@pytest.fixture(autouse=True)
def pinned_cache_model(monkeypatch):
    """Automatic tile sizes computed from PINNED_CACHE_SIZES and PINNED_CORES, not from this
    machine's caches and cores."""
    processor = polyc.target.host()
    pinned = tuple(PINNED_CACHE_SIZES[level] for level in (1, 2, 3))
    monkeypatch.setattr(polyc.target, "host", lambda: dataclasses.replace(processor, caches=pinned))
    monkeypatch.setattr(tiling, "usable_cores", lambda: PINNED_CORES)


def kernel_of(case: str, **options) -> polyc.api.Kernel:
    # The goldens follow the generic polyhedral path; matmul and mlp would otherwise take the
    # gemm back end (tests/test_gemm.py).
    module = polyc.define(CASES[case], filename=f"<{case}>", **{"blas_contractions": False, **options})
    return module[case]


def sizes_of(kernel, variant: str) -> dict | None:
    """The sizes a variant compiles for (None: parametric)."""
    return None if variant == "parametric" else {s: 64 for s in kernel.definition.sizes}


def stages_of(case: str, variant: str = "sizes64", **options):
    kernel = kernel_of(case, **options)
    return kernel.stages(sizes_of(kernel, variant))


# ----------------------------------------------------------------------------- normalisation
_ISL_POINTER = re.compile(r"@0x[0-9a-fA-F]+")
_ISL_BRACES = re.compile(r"\{([^{}]*)\}")


def normalise_isl(text: str) -> str:
    """isl text with ids' pointer addresses dropped and the pieces of each union sorted."""
    text = _ISL_POINTER.sub("", text)

    def sort_pieces(match: re.Match) -> str:
        if ";" not in match.group(1):
            return match.group(0)
        return "{ " + "; ".join(sorted(piece.strip() for piece in match.group(1).split(";"))) + " }"

    return _ISL_BRACES.sub(sort_pieces, text)


def normalise_c(source: str) -> str:
    """Generated C with the shared prelude replaced by a line naming where it comes from."""
    return source.replace(PRELUDE, "/* (polyc prelude omitted: see polyc/codegen/c_expr.py) */")


def schedule_tree_text(schedule: isl.Schedule) -> str:
    """A schedule tree in isl's block YAML notation: one node field per line."""
    printer = isl.Printer.to_str(schedule.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()


def golden_texts(stages) -> dict[str, str]:
    """File name -> normalised text, for every stage that has a golden file."""
    texts = {
        "model.txt": normalise_isl(stages.program.to_isl_text()),
        "dependences.txt": normalise_isl(stages.dependences.to_text()),
        "schedule.yaml": normalise_isl(schedule_tree_text(stages.schedule)),
        "optimized_schedule.yaml": normalise_isl(schedule_tree_text(stages.optimized_schedule)),
        "kernel.c": normalise_c(stages.kernel.source),
    }
    return {
        name: "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n" for name, text in texts.items()
    }


# ----------------------------------------------------------------------------- golden files
def compare_with_golden(path: Path, actual: str, update: bool) -> str | None:
    """Write ``actual`` to ``path`` when updating; otherwise a diff message if they differ."""
    relative = path.relative_to(GOLDEN_DIR.parent.parent)
    if update:
        if not path.exists() or path.read_text() != actual:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual)
        return None
    if not path.exists():
        return f"{relative}: no golden file yet"
    expected = path.read_text()
    if expected == actual:
        return None
    diff = difflib.unified_diff(
        expected.splitlines(keepends=True),
        actual.splitlines(keepends=True),
        fromfile=f"{relative} (stored)",
        tofile=f"{relative} (now)",
    )
    return "".join(diff)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case, variant, update_goldens):
    texts = golden_texts(stages_of(case, variant))
    problems = [
        problem
        for name, text in texts.items()
        if (problem := compare_with_golden(GOLDEN_DIR / case / variant / name, text, update_goldens))
    ]
    if problems:
        pytest.fail(
            "\n".join(problems) + "\n\nThe compiler's output differs from the stored goldens "
            f"(islpy {'.'.join(map(str, isl.VERSION))}).  If the change is intended, review the "
            "diff above, then rerun with\n    python -m pytest tests/test_golden.py --update-goldens\n"
            "and commit the updated files under tests/golden/.",
            pytrace=False,
        )


# ----------------------------------------------------------------------------- isl helpers
def union_map(stages, text: str) -> isl.UnionMap:
    """``text`` (a map over the program's statements, without parameters) in the program's space."""
    params = "[" + ", ".join(stages.program.params) + "]"
    return isl.UnionMap.read_from_str(stages.program.ctx, f"{params} -> {text}")


def statement_names(union_set: isl.UnionSet) -> set[str]:
    names: set[str] = set()
    union_set.foreach_set(lambda s: names.add(s.get_tuple_name()))
    return names


def member_schedules_index(band: isl.ScheduleNode, member: int, statement: isl.Set, index: str) -> bool:
    """Whether band member ``member`` schedules ``statement``'s instances by ``index`` alone."""
    schedule = isl.UnionMap.from_union_pw_aff(band.band_get_partial_schedule().get_at(member))
    schedule = schedule.intersect_domain(isl.UnionSet.from_set(statement))
    dims = ", ".join(statement.get_space().get_var_names(isl.dim_type.set))
    params = "[" + ", ".join(statement.get_space().get_var_names(isl.dim_type.param)) + "]"
    expected = isl.UnionMap.read_from_str(
        statement.get_ctx(), f"{params} -> {{ {statement.get_tuple_name()}[{dims}] -> [{index}] }}"
    )
    return schedule.is_equal(expected.intersect_domain(isl.UnionSet.from_set(statement)))


# ----------------------------------------------------------------------------- matmul semantics
@pytest.mark.parametrize("variant", VARIANTS)
def test_matmul_dependences_leave_m_and_n_parallel(variant):
    stages = stages_of("matmul", variant)
    deps = stages.dependences
    same_target = union_map(stages, "{ S0_init[m, n] -> S0[m, n, k]; S0[m, n, k] -> S0[m, n, k2] }")
    # Nothing relates instances for different (m, n): both loops are parallel.
    assert deps.all.is_subset(same_target)
    # The reduction dependences order r_k within one output element ...
    assert not deps.reduction.is_empty()
    assert deps.reduction.is_subset(union_map(stages, "{ S0[m, n, k] -> S0[m, n, k2] : k2 > k }"))
    # ... and every other dependence goes from the init of an element to its updates.
    assert deps.non_reduction.is_subset(union_map(stages, "{ S0_init[m, n] -> S0[m, n, k] }"))
    assert deps.non_reduction.intersect(union_map(stages, "{ S0[m, n, k] -> S0[m2, n2, k2] }")).is_empty()
    assert not deps.flow.intersect(union_map(stages, "{ S0_init[m, n] -> S0[m, n, k] }")).is_empty()


@pytest.mark.parametrize("variant", VARIANTS)
def test_matmul_scheduler_marks_m_and_n_coincident_and_r_k_not(variant):
    stages = stages_of("matmul", variant)
    band = stages.schedule.get_root().child(0)
    assert band.get_type() == isl.schedule_node_type.band
    update = stages.program.statement("S0").domain
    members = {}
    for index in ("m", "n", "r_k"):
        found = [i for i in range(band.band_n_member()) if member_schedules_index(band, i, update, index)]
        assert found, f"no member of the outer band schedules {index}:\n{stages.schedule}"
        members[index] = found[0]
    assert band.band_member_get_coincident(members["m"])
    assert band.band_member_get_coincident(members["n"])
    assert not band.band_member_get_coincident(members["r_k"])


def function_body(source: str) -> list[str]:
    """Lines of the kernel function, from its opening brace on."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("int polyc_"))
    return lines[start + 1 :]


@pytest.mark.parametrize("variant", VARIANTS)
def test_matmul_c_parallelises_the_outermost_loop_with_int64_iterators(variant):
    body = function_body(stages_of("matmul", variant).kernel.source)
    loops = [i for i, line in enumerate(body) if line.lstrip().startswith("for (")]
    outermost = loops[0]
    assert all(
        len(body[i]) - len(body[i].lstrip()) >= len(body[outermost]) - len(body[outermost].lstrip()) for i in loops
    )
    # A short outermost loop shares its iteration space with the parallel loops in it (collapse).
    assert re.fullmatch(r"#pragma omp parallel for( simd| collapse\(\d\))?", body[outermost - 1].strip())
    assert sum("omp parallel" in line for line in body) == 1
    iterator_types = {re.match(r"\s*for \((\w+) (?:c\d+|polyc_tile_\w+) =", body[i]).group(1) for i in loops}
    assert iterator_types == {"int64_t"}


# ----------------------------------------------------------------------------- producer-consumer
@pytest.mark.parametrize("variant", VARIANTS)
def test_scale_shift_flows_from_producer_to_consumer_at_distance_zero(variant):
    stages = stages_of("scale_shift", variant)
    producer_to_consumer = stages.dependences.flow.intersect(union_map(stages, "{ S0[i, j] -> S1[i2, j2] }"))
    assert not producer_to_consumer.is_empty()
    assert producer_to_consumer.is_subset(union_map(stages, "{ S0[i, j] -> S1[i, j] }"))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ["scale_shift", "mlp"])
@pytest.mark.parametrize("fusion", ["smart", "max"])
def test_fusion_puts_producer_and_consumer_in_one_outer_band(fusion, case, variant):
    stages = stages_of(case, variant, fusion=fusion)
    top = stages.schedule.get_root().child(0)
    assert top.get_type() == isl.schedule_node_type.band, str(stages.schedule)
    assert top.band_n_member() >= 2  # the loops over i and j are shared
    assert statement_names(top.get_domain()) == {s.name for s in stages.program.statements}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", ["scale_shift", "mlp"])
def test_min_fusion_gives_separate_loop_nests(case, variant):
    stages = stages_of(case, variant, fusion="min")
    top = stages.schedule.get_root().child(0)
    assert top.get_type() == isl.schedule_node_type.sequence, str(stages.schedule)
    filters = [statement_names(top.child(i).filter_get_filter()) for i in range(top.n_children())]
    assert filters == [{s.name} for s in stages.program.statements]


def test_scale_shift_smaller_than_a_tile_still_runs_in_parallel():
    body = function_body(stages_of("scale_shift", "sizes64").kernel.source)
    assert any("#pragma omp parallel for" in line for line in body)
