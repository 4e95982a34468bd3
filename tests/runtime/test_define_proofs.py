"""The define-time proofs in the cache (polyc.runtime.proofs): a later define of the same def reads
what the bounds and coverage proofs found instead of building its polyhedral model, finds the
same, and anything wrong with the record is only a miss."""

from __future__ import annotations

import json

import numpy as np
import pytest

import polyc
from polyc.errors import BoundsError
from polyc.runtime import proofs

# K bounds the index of A: the accesses are in bounds only when K <= N (a precondition), and B
# is written before it is read, as is the temporary T.
GUARDED = """def head(float(N) A, int32 K) -> (B) {
    T(i) = A(i) * 2 where i in 0:K
    B(i) = T(i) + 1 where i in 0:K
}"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    return tmp_path


def proof_records(cache):
    return sorted((cache / proofs.PROOFS_DIR).rglob("*.json"))


def forbid_proving(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the proofs ran again")

    monkeypatch.setattr(proofs, "build_program", fail)


def test_a_recorded_proof_is_read_back_and_checks_calls_the_same(cache, monkeypatch):
    first = polyc.define(GUARDED, backend="interpreter").head
    (record,) = proof_records(cache)
    forbid_proving(monkeypatch)
    again = polyc.define(GUARDED, backend="interpreter").head
    assert str(again.bounds_precondition) == str(first.bounds_precondition) != "none"
    assert again._written_before_read == first._written_before_read == {"B", "T"}
    a = np.arange(6, dtype=np.float32)
    np.testing.assert_array_equal(again(a, np.int32(4)), a[:4] * 2 + 1)
    with pytest.raises(BoundsError) as read_back:
        again(a, np.int32(7))
    monkeypatch.undo()
    with pytest.raises(BoundsError) as proved:
        first(a, np.int32(7))
    assert str(read_back.value) == str(proved.value)
    assert "K=7" in str(read_back.value)


def test_other_text_is_another_record(cache):
    polyc.define(GUARDED, backend="interpreter")
    polyc.define(GUARDED.replace("* 2", "* 3"), backend="interpreter")
    polyc.define(GUARDED.replace("* 2", "* 3"), backend="interpreter")
    assert len(proof_records(cache)) == 2


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "not an object", "wrong fields", "bad isl", "unknown tensor", "no violations", "covered"],
)
def test_a_broken_record_is_a_miss_and_is_written_again(cache, damage):
    polyc.define(GUARDED, backend="interpreter")
    (record,) = proof_records(cache)
    good = json.loads(record.read_text())
    text = record.read_text()
    broken = {
        "garbage": "{not json",
        "truncated": text[: len(text) // 2],
        "not an object": "[1, 2]",
        "wrong fields": json.dumps({"bounds": {"params": ["N"]}}),
        "bad isl": json.dumps(
            {
                **good,
                "bounds": {
                    **good["bounds"],
                    "violations": [{"description": "x", "sizes": "{ this is not isl", "loc": [1, 1]}],
                },
            }
        ),
        "unknown tensor": json.dumps({**good, "written_before_read": ["B", "A"]}),
        # well-formed and wrong: no precondition (A read past its end when K > N); any list of
        # covered tensors other than the proof's (here a harmless one: T zeroed needlessly)
        "no violations": json.dumps({**good, "bounds": {**good["bounds"], "violations": []}}),
        "covered": json.dumps({**good, "written_before_read": ["B"]}),
    }[damage]
    record.write_text(broken)
    kernel = polyc.define(GUARDED, backend="interpreter").head
    assert kernel._written_before_read == {"B", "T"}
    assert "K" in str(kernel.bounds_precondition)
    with pytest.raises(BoundsError, match="K=7"):
        kernel(np.arange(6, dtype=np.float32), np.int32(7))
    assert json.loads(record.read_text()) == good


def test_an_always_wrong_def_is_not_recorded(cache):
    wrong = "def shift(float(N) A) -> (B) { B(i) = A(i + 1) where i in 0:N }"
    for _ in range(2):
        with pytest.raises(BoundsError, match="for every choice of sizes"):
            polyc.define(wrong)
    assert proof_records(cache) == []


def test_a_cache_that_cannot_be_used_only_loses_the_record(tmp_path, monkeypatch):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monkeypatch.setenv("POLYC_CACHE_DIR", str(not_a_directory))
    kernel = polyc.define(GUARDED, backend="interpreter").head
    assert kernel._written_before_read == {"B", "T"}
    np.testing.assert_array_equal(kernel(np.ones(3, np.float32), np.int32(2)), [3, 3])
