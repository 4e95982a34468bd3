"""Quasi-affine integer expressions over named sizes and indices.

Index expressions (``2 * h + r_kh``), inferred ranges (``floor((H - KH) / 2) + 1``) and tensor
shapes are all values of one small algebra: integer linear combinations of names and of
non-linear atoms (floor division by a constant, min, max).  The same object evaluates for
concrete sizes, prints as TC, as C and as isl syntax, so every later stage reads the one fact
the front end derived instead of deriving it again.

    >>> h, kh, H = Affine.var("h"), Affine.var("kh"), Affine.var("H")
    >>> str((H - kh).floordiv(2) + 1)
    'floor((H - kh) / 2) + 1'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class FloorDiv:
    """``floor(numerator / denominator)`` with a positive constant denominator."""

    numerator: Affine
    denominator: int


@dataclass(frozen=True)
class MinMax:
    """``min(args)`` or ``max(args)`` (``kind`` is "min" or "max") of two or more expressions."""

    kind: str
    args: tuple[Affine, ...]


Atom = str | FloorDiv | MinMax


def _atom_key(atom: Atom) -> tuple:
    # Names sort before compound atoms; compound atoms by their printed form.
    return (0, atom) if isinstance(atom, str) else (1, _atom_str(atom))


def _atom_str(atom: Atom) -> str:
    if isinstance(atom, str):
        return atom
    if isinstance(atom, FloorDiv):
        return f"floor(({atom.numerator}) / {atom.denominator})"
    return f"{atom.kind}({', '.join(str(a) for a in atom.args)})"


@dataclass(frozen=True)
class Affine:
    """``sum(coefficient * atom) + constant`` with integer coefficients; immutable and hashable.

    ``terms`` is kept sorted with no zero coefficients, so equal expressions compare equal.
    """

    terms: tuple[tuple[Atom, int], ...] = ()
    constant: int = 0

    # ------------------------------------------------------------------ construction
    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, 1),), 0)

    @staticmethod
    def const(value: int) -> Affine:
        return Affine((), int(value))

    @staticmethod
    def _make(coefficients: Mapping[Atom, int], constant: int) -> Affine:
        terms = tuple(sorted(((a, c) for a, c in coefficients.items() if c != 0), key=lambda t: _atom_key(t[0])))
        return Affine(terms, int(constant))

    @staticmethod
    def lift(value: Affine | int) -> Affine:
        return value if isinstance(value, Affine) else Affine.const(value)

    # ------------------------------------------------------------------ queries
    @property
    def is_constant(self) -> bool:
        return not self.terms

    def coefficient(self, name: str) -> int:
        return dict(self.terms).get(name, 0)

    def names(self) -> frozenset[str]:
        """Every name the expression depends on, including those inside floor/min/max."""
        found: set[str] = set()
        for atom, _ in self.terms:
            if isinstance(atom, str):
                found.add(atom)
            elif isinstance(atom, FloorDiv):
                found |= atom.numerator.names()
            else:
                for arg in atom.args:
                    found |= arg.names()
        return frozenset(found)

    def linear_names(self) -> frozenset[str]:
        """Names that occur as plain linear terms (not inside floor/min/max)."""
        return frozenset(a for a, _ in self.terms if isinstance(a, str))

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: Affine | int) -> Affine:
        other = Affine.lift(other)
        coefficients = dict(self.terms)
        for atom, c in other.terms:
            coefficients[atom] = coefficients.get(atom, 0) + c
        return Affine._make(coefficients, self.constant + other.constant)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return self * -1

    def __sub__(self, other: Affine | int) -> Affine:
        return self + (-Affine.lift(other))

    def __rsub__(self, other: Affine | int) -> Affine:
        return Affine.lift(other) - self

    def __mul__(self, factor: int) -> Affine:
        if not isinstance(factor, int):
            return NotImplemented
        return Affine._make({a: c * factor for a, c in self.terms}, self.constant * factor)

    __rmul__ = __mul__

    def floordiv(self, denominator: int) -> Affine:
        """``floor(self / denominator)``, exact when every coefficient is divisible."""
        if denominator <= 0:
            raise ValueError("floor division by a non-positive constant")
        if denominator == 1:
            return self
        if all(c % denominator == 0 for _, c in self.terms):
            whole = Affine._make({a: c // denominator for a, c in self.terms}, 0)
            if self.constant % denominator == 0:
                return whole + self.constant // denominator
            if self.is_constant:
                return Affine.const(self.constant // denominator)
        return Affine(((FloorDiv(self, denominator), 1),), 0)

    def ceildiv(self, denominator: int) -> Affine:
        """``ceil(self / denominator)`` = ``-floor(-self / denominator)``."""
        return -((-self).floordiv(denominator))

    def minimum(self, other: Affine | int) -> Affine:
        return _min_max("min", [self, Affine.lift(other)])

    def maximum(self, other: Affine | int) -> Affine:
        return _min_max("max", [self, Affine.lift(other)])

    def substitute(self, values: Mapping[str, Affine | int]) -> Affine:
        """Replace names by expressions (names not in ``values`` stay)."""
        return self._rebuild(lambda name: Affine.lift(values[name]) if name in values else Affine.var(name))

    def _rebuild(self, leaf: Callable[[str], Affine]) -> Affine:
        result = Affine.const(self.constant)
        for atom, c in self.terms:
            if isinstance(atom, str):
                part = leaf(atom)
            elif isinstance(atom, FloorDiv):
                part = atom.numerator._rebuild(leaf).floordiv(atom.denominator)
            else:
                part = _min_max(atom.kind, [a._rebuild(leaf) for a in atom.args])
            result = result + part * c
        return result

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, values: Mapping[str, int]) -> int:
        """The integer value for concrete values of every name; KeyError names a missing one."""
        total = self.constant
        for atom, c in self.terms:
            total += c * _eval_atom(atom, values)
        return total

    def bounds(self, ranges: Mapping[str, tuple[Affine, Affine]]) -> tuple[Affine, Affine]:
        """Smallest and largest value when each name in ``ranges`` varies over [lo, hi] (inclusive).

        Only valid for names that occur linearly; other names stay symbolic.
        """
        low = high = Affine.const(self.constant)
        for atom, c in self.terms:
            if isinstance(atom, str) and atom in ranges:
                lo, hi = ranges[atom]
                low, high = (low + lo * c, high + hi * c) if c > 0 else (low + hi * c, high + lo * c)
            else:
                term = Affine(((atom, c),), 0)
                low, high = low + term, high + term
        return low, high

    # ------------------------------------------------------------------ printing
    def __str__(self) -> str:
        return self.render(lambda name: name, "floor(({}) / {})")

    def to_c(self, name_of: Callable[[str], str] = lambda n: n) -> str:
        """C99 text; floor division goes through the ``polyc_floord`` helper of generated code."""
        return self.render(name_of, "polyc_floord({}, {})", c_syntax=True)

    def to_isl(self) -> str:
        """isl's syntax for quasi-affine expressions."""
        return self.render(lambda name: name, "floor(({}) / {})")

    def render(self, name_of: Callable[[str], str], floor_format: str, c_syntax: bool = False) -> str:
        parts: list[str] = []
        # Positive terms first reads naturally: "W - KW + 1", not "-KW + W + 1".
        for atom, c in sorted(self.terms, key=lambda t: t[1] < 0):
            if isinstance(atom, str):
                text = name_of(atom)
            elif isinstance(atom, FloorDiv):
                text = floor_format.format(atom.numerator.render(name_of, floor_format, c_syntax), atom.denominator)
            else:
                inner = [a.render(name_of, floor_format, c_syntax) for a in atom.args]
                text = _nest_min_max(atom.kind, inner) if c_syntax else f"{atom.kind}({', '.join(inner)})"
            magnitude = abs(c)
            body = text if magnitude == 1 else f"{magnitude} * {text}"
            if not parts:
                parts.append(body if c > 0 else f"-{body}")
            else:
                parts.append(f"{'+' if c > 0 else '-'} {body}")
        if self.constant or not parts:
            if not parts:
                parts.append(str(self.constant))
            else:
                parts.append(f"{'+' if self.constant > 0 else '-'} {abs(self.constant)}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Affine({self})"


def affine_arithmetic(op: str, lhs: Affine | None, rhs: Affine | None) -> Affine | None:
    """``lhs op rhs`` for op in ``+ - *`` when the result is affine (a product needs a constant
    factor); None otherwise, or when an operand is already None."""
    if lhs is None or rhs is None:
        return None
    if op == "+":
        return lhs + rhs
    if op == "-":
        return lhs - rhs
    if op == "*":
        if lhs.is_constant:
            return rhs * lhs.constant
        if rhs.is_constant:
            return lhs * rhs.constant
    return None


def _nest_min_max(kind: str, args: list[str]) -> str:
    text = args[0]
    for arg in args[1:]:
        text = f"polyc_{kind}({text}, {arg})"
    return text


def _eval_atom(atom: Atom, values: Mapping[str, int]) -> int:
    if isinstance(atom, str):
        return int(values[atom])
    if isinstance(atom, FloorDiv):
        return atom.numerator.evaluate(values) // atom.denominator
    evaluated = [a.evaluate(values) for a in atom.args]
    return min(evaluated) if atom.kind == "min" else max(evaluated)


def _min_max(kind: str, args: Iterable[Affine]) -> Affine:
    """min/max with nested same-kind calls flattened, duplicates removed and constants folded.

    Two arguments that differ by a constant keep only the smaller (min) or larger (max) one.
    """
    flat: list[Affine] = []
    for arg in args:
        if (
            len(arg.terms) == 1
            and arg.constant == 0
            and arg.terms[0][1] == 1
            and isinstance(arg.terms[0][0], MinMax)
            and arg.terms[0][0].kind == kind
        ):
            flat.extend(arg.terms[0][0].args)
        else:
            flat.append(arg)
    pick = min if kind == "min" else max
    kept: list[Affine] = []
    for arg in flat:
        for position, other in enumerate(kept):
            if other.terms == arg.terms:
                kept[position] = Affine(arg.terms, pick(other.constant, arg.constant))
                break
        else:
            kept.append(arg)
    if len(kept) == 1:
        return kept[0]
    kept.sort(key=str)
    return Affine(((MinMax(kind, tuple(kept)), 1),), 0)
