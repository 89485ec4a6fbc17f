"""The multi-process pipeline runtime on ``torch.distributed`` (terms: :mod:`pipelab`).

:class:`PipelineRuntime` (:mod:`.runtime`) runs one worker's program per rank on the emulator's pipeline core,
over :mod:`.p2p` (metered: :mod:`.meter`; NCCL's order: :mod:`.nccl_order`) and :mod:`.collectives`;
:mod:`.checkpoint` resumes a run mid-flight; :mod:`.torch_pipelining` is the torch-equivalence reference. Launch
with ``torchrun -m pipelab.studies.run`` or :func:`pipelab.distributed.spawn`.
"""

from __future__ import annotations

from ..schedules.transfers import channels, consistent_cut
from .checkpoint import CheckpointError, load_checkpoint, read_header, save_checkpoint
from .runtime import PipelineRuntime, RuntimeResult
from .torch_pipelining import TorchPipeliningResult, run_torch_pipelining

__all__ = ["PipelineRuntime", "RuntimeResult", "channels", "consistent_cut", "save_checkpoint", "load_checkpoint",
           "read_header", "CheckpointError", "run_torch_pipelining", "TorchPipeliningResult"]
