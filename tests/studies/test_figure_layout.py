"""Figure layout: nothing a reader needs is covered (legends beside the regions they label)."""

from __future__ import annotations

import pytest

from pipelab.studies import figures, style


@pytest.mark.parametrize("name", ["stability_gd_regions", "stability_momentum_regions",
                                  "stability_prediction_regions"])
def test_region_legends_lie_outside_the_panels(name: str) -> None:
    """Inside a panel a legend covers part of a region's outline (the no-delay disk reaches every corner)."""
    with style.context():
        fig = figures.make(name, "tiny").figure
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        for ax in fig.axes:
            legend = ax.get_legend()
            assert legend is not None
            box, panel = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert not box.overlaps(panel), (name, ax.get_title())
            assert fig.bbox.contains(box.x0, box.y0) and fig.bbox.contains(box.x1, box.y1), (name, ax.get_title())
