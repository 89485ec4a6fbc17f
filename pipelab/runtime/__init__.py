"""The multi-process pipeline runtime on ``torch.distributed`` (DESIGN §6).

- :class:`PipelineRuntime` (:mod:`.engine`): one worker's program per rank, sharing the emulator's
  stage executors, policies and predictors; gloo on CPU, NCCL on GPUs;
- :func:`consistent_cut`, :func:`save_checkpoint`, :func:`load_checkpoint` (:mod:`.checkpoint`): resume a
  run mid-flight identically;
- launch with ``torchrun -m pipelab.run`` or :func:`pipelab.distributed.spawn`.
"""

from __future__ import annotations

from ..schedules.transfers import channels, consistent_cut
from .checkpoint import CheckpointError, load_checkpoint, read_header, save_checkpoint
from .engine import PipelineRuntime, RuntimeResult

__all__ = ["PipelineRuntime", "RuntimeResult", "channels", "consistent_cut", "save_checkpoint", "load_checkpoint",
           "read_header", "CheckpointError"]
