"""pipelab's matplotlib/seaborn style, shipped as ``pipelab.mplstyle``.

Example:
    >>> from pipelab.studies import style
    >>> with style.context():
    ...     pass  # figures drawn here use the style
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import matplotlib
from matplotlib import rcsetup

__all__ = ["STYLE_FILE", "PALETTE", "use", "context"]

STYLE_FILE = Path(__file__).with_name("pipelab.mplstyle")
#: Colour-blind-safe qualitative palette used for schemes/policies across figures.
PALETTE = "colorblind"


def _rc() -> dict:
    import seaborn as sns

    rc = dict(matplotlib.rc_params_from_file(str(STYLE_FILE), use_default_template=False))
    rc["axes.prop_cycle"] = rcsetup.cycler(color=sns.color_palette(PALETTE))
    return rc


def use() -> None:
    """Apply the style globally (notebooks call this once)."""
    matplotlib.rcParams.update(_rc())


@contextlib.contextmanager
def context() -> Iterator[None]:
    """Apply the style inside a ``with`` block only."""
    with matplotlib.rc_context(_rc()):
        yield
