"""A learned cost model: gradient-boosted trees predicting log(time) from a configuration's features.

As in AutoTVM and Ansor, the model is not asked to be right about absolute times, only to rank
unmeasured candidates well enough that the explorer measures promising ones first.  It is
retrained from scratch after every batch of measurements (a few hundred points at most: cheap).
"""

from __future__ import annotations

import math

import numpy as np

from polyc.errors import PolycError


class CostModel:
    """``fit`` on measured (features, seconds); ``predict`` log-seconds for unmeasured features."""

    #: Fewer points than this: the trees would only learn noise; predict() ranks randomly.
    MIN_POINTS = 6

    def __init__(self, seed: int = 0):
        try:
            from sklearn.ensemble import GradientBoostingRegressor
        except ImportError as error:  # the `tune` extra brings it
            raise PolycError(
                "the tuner's cost model needs scikit-learn: pip install 'polyc[tune]' (or tune with strategy='random')"
            ) from error
        self._make = lambda: GradientBoostingRegressor(
            n_estimators=120, max_depth=3, learning_rate=0.1, subsample=0.9, random_state=seed
        )
        self._model = None
        self._rng = np.random.default_rng(seed)

    @property
    def trained(self) -> bool:
        return self._model is not None

    def fit(self, features: list[list[float]], seconds: list[float]) -> None:
        if len(features) < self.MIN_POINTS:
            self._model = None
            return
        model = self._make()
        model.fit(np.asarray(features, dtype=np.float64), np.log(np.asarray(seconds, dtype=np.float64)))
        self._model = model

    def predict(self, features: list[list[float]]) -> np.ndarray:
        """Predicted log-seconds (lower is better); random ranks before the model is trained."""
        if not features:
            return np.zeros(0)
        if self._model is None:
            return self._rng.random(len(features))
        return self._model.predict(np.asarray(features, dtype=np.float64))


def pruning_limit(best_seconds: float | None, factor: float) -> float:
    """A candidate whose first two runs take longer than this is stopped there (TC's pruning)."""
    return math.inf if best_seconds is None else best_seconds * factor
