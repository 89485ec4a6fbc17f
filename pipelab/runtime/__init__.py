"""The multi-process pipeline runtime on ``torch.distributed`` (terms: :mod:`pipelab`).

- :class:`PipelineRuntime` (:mod:`.engine`): one worker's program per rank, sharing the emulator's
  stage executors, policies and predictors; gloo on CPU, NCCL on GPUs;
- :func:`consistent_cut`, :func:`save_checkpoint`, :func:`load_checkpoint` (:mod:`.checkpoint`): resume a
  run mid-flight identically;
- launch with ``torchrun -m pipelab.run`` or :func:`pipelab.distributed.spawn`.
"""

from __future__ import annotations

from .checkpoint import CheckpointError, consistent_cut, load_checkpoint, read_header, save_checkpoint
from .engine import PipelineRuntime, RuntimeResult, channels

__all__ = ["PipelineRuntime", "RuntimeResult", "channels", "consistent_cut", "save_checkpoint", "load_checkpoint",
           "read_header", "CheckpointError"]
