"""Pipeline schedules as data: actions, builders, the general constructor, the dependency rule, validation,
the version table.
"""

from __future__ import annotations

from .actions import COMPUTE_OPS, OPS, WEIGHT_RULES, Action, Schedule
from .builders import (
                       BUILDERS,
                       ddp,
                       folded,
                       fsdp,
                       fslpp,
                       gpipe,
                       hybrid,
                       interleaved_1f1b,
                       lpp,
                       lpp_hash,
                       naive,
                       one_f_one_b,
                       pipedream,
                       pipedream_2bw,
)
from .constructor import PRIORITIES, construct
from .dependencies import EDGES, Edge, Job, dependencies
from .torch_actions import from_torch, from_torch_csv, to_torch, to_torch_csv
from .transfers import ACT, GRAD, Message, channel, channels, consistent_cut, messages
from .v_shape import dualpipe, dualpipe_v, interleaved_zero_bubble, v_half, v_min, v_stage, zb_v
from .validate import ScheduleError, format_grid, validate
from .versions import USED_RULES, VersionTable
from .zero_bubble import split_order, zb_async, zb_h1, zb_h2

__all__ = [
    "Action", "Schedule", "OPS", "COMPUTE_OPS", "WEIGHT_RULES",
    "naive", "gpipe", "one_f_one_b", "pipedream", "pipedream_2bw", "interleaved_1f1b", "folded", "ddp", "fsdp",
    "lpp", "fslpp", "lpp_hash", "hybrid", "BUILDERS",
    "zb_h1", "zb_h2", "zb_async", "split_order",
    "zb_v", "v_half", "v_min", "interleaved_zero_bubble", "dualpipe_v", "dualpipe", "v_stage",
    "construct", "PRIORITIES",
    "Job", "Edge", "EDGES", "dependencies",
    "validate", "ScheduleError", "format_grid",
    "Message", "messages", "channels", "channel", "consistent_cut", "ACT", "GRAD",
    "VersionTable", "USED_RULES",
    "from_torch", "from_torch_csv", "to_torch", "to_torch_csv",
]
