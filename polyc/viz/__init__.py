"""Pictures and explanations of what the polyhedral compiler did.

- :func:`polyc.viz.explain.explain` (``kernel.explain(sizes)``): every loop, parallel or not,
  vectorised or not, tiled, fused, and why, with witnesses.
- :func:`polyc.viz.domain.plot_domain`: a statement's points at small sizes, the dependence
  arrows between them, the order the compiled schedule runs them in, its tiles and parallel
  loop (matplotlib; SVG/PNG).
- :func:`polyc.viz.view.view_domain`: the same in 2-D or 3-D, interactive in a notebook (rotate,
  zoom, filter, colour by order, tile or thread, step through the order), plain HTML.
- :func:`polyc.viz.schedule_tree.schedule_tree`: the compiled schedule tree as a diagram beside
  the loop nest it became (HTML).
- :func:`polyc.viz.gpu.plot_gpu_mapping`: the GPU mapping of a def, each instance coloured by
  the block that runs it and labelled with its thread, the shared-memory tiles outlined;
  :func:`polyc.viz.gpu.block_footprints`: each block's elements per tensor and its reuse with
  the next block (matplotlib; a table); :func:`polyc.viz.gpu.tile_footprints`: the same for
  the tiles of the compiled CPU schedule.
- :func:`polyc.viz.explain.check_schedule` (``kernel.check_schedule(schedule)``): a schedule of
  your own, accepted or refused with the dependences it violates.
"""

from polyc.viz.domain import DomainPlot, plot_domain
from polyc.viz.explain import Explanation, LoopExplanation, ScheduleCheck, Witness, check_schedule, explain
from polyc.viz.gpu import Footprints, GpuMappingPlot, block_footprints, plot_gpu_mapping, tile_footprints
from polyc.viz.schedule_tree import ScheduleTreeView, schedule_tree
from polyc.viz.view import DomainView, view_domain

__all__ = [
    "plot_domain",
    "DomainPlot",
    "view_domain",
    "DomainView",
    "plot_gpu_mapping",
    "GpuMappingPlot",
    "block_footprints",
    "tile_footprints",
    "Footprints",
    "schedule_tree",
    "ScheduleTreeView",
    "explain",
    "check_schedule",
    "Explanation",
    "LoopExplanation",
    "ScheduleCheck",
    "Witness",
]
