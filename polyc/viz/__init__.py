"""Pictures and explanations of what the polyhedral compiler did.

- :func:`polyc.viz.explain.explain` (``kernel.explain(sizes)``): every loop, parallel or not,
  vectorised or not, tiled, fused, and why, with witnesses.
- :func:`polyc.viz.explain.check_schedule` (``kernel.check_schedule(schedule)``): a schedule of
  your own, accepted or refused with the dependences it violates.
"""
from polyc.viz.explain import Explanation, LoopExplanation, ScheduleCheck, Witness, check_schedule, explain

__all__ = ["explain", "check_schedule", "Explanation", "LoopExplanation", "ScheduleCheck", "Witness"]
