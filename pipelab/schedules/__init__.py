"""Pipeline schedules as data: actions, builders, the general constructor, validation, version tables.

Example:
    >>> from pipelab.schedules import one_f_one_b, validate
    >>> from pipelab.simulator import simulate
    >>> s = one_f_one_b(D=4, M=8)
    >>> validate(s)
    >>> simulate(s).peak_activations.tolist()
    [4, 3, 2, 1]
"""

from __future__ import annotations

from .actions import COMPUTE_OPS, OPS, WEIGHT_RULES, Action, Schedule
from .builders import (BUILDERS, ddp, folded, fsdp, fslpp, gpipe, interleaved_1f1b, lpp, lpp_hash, naive,
                       one_f_one_b, pipedream, pipedream_2bw)
from .constructor import PRIORITIES, construct
from .transfers import ACT, GRAD, Message, channel_tag, channels, consistent_cut, messages
from .validate import ScheduleError, format_grid, validate
from .versions import (USED_RULES, VersionTable, async_1f1b_staleness, pipeoptim_staleness,
                       spectrain_version_difference)

__all__ = [
    "Action", "Schedule", "OPS", "COMPUTE_OPS", "WEIGHT_RULES",
    "naive", "gpipe", "one_f_one_b", "pipedream", "pipedream_2bw", "interleaved_1f1b", "folded", "ddp", "fsdp",
    "lpp", "fslpp", "lpp_hash", "BUILDERS",
    "construct", "PRIORITIES",
    "validate", "ScheduleError", "format_grid",
    "Message", "messages", "channels", "channel_tag", "consistent_cut", "ACT", "GRAD",
    "VersionTable", "USED_RULES", "pipeoptim_staleness", "spectrain_version_difference", "async_1f1b_staleness",
]
