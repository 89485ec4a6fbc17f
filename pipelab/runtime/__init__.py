"""The multi-process pipeline runtime on ``torch.distributed`` (terms: :mod:`pipelab`).

- :class:`PipelineRuntime` (:mod:`.runtime`): one worker's program per rank, on the pipeline core the
  emulator runs (:mod:`pipelab.pipeline`: driver loop, stage executors, policies and predictors); gloo on
  CPU, NCCL on GPUs;
- :class:`~pipelab.runtime.p2p.P2PTransport` (:mod:`.p2p`): the ``torch.distributed`` point-to-point transport;
  :class:`~pipelab.runtime.meter.MeteredTransport` (:mod:`.meter`, ``PipelineRuntime(network=...)``): the same,
  each message held until its arrival under the link model of :mod:`pipelab.links` (slow links on one machine);
- :mod:`.nccl_order`: the send/receive order that cannot deadlock under NCCL's semantics (the transport's
  default there);
- :func:`save_checkpoint`, :func:`load_checkpoint` (:mod:`.checkpoint`): resume a run mid-flight identically,
  through :meth:`PipelineRuntime.state_dict`; the cut is :func:`~pipelab.schedules.consistent_cut`;
- :func:`run_torch_pipelining` (:mod:`.torch_pipelining`): a flushed schedule exported to, and run by,
  ``torch.distributed.pipelining``'s own runtime (the torch-equivalence reference);
- launch with ``torchrun -m pipelab.studies.run`` or :func:`pipelab.distributed.spawn`.
"""

from __future__ import annotations

from ..schedules.transfers import channels, consistent_cut
from .checkpoint import CheckpointError, load_checkpoint, read_header, save_checkpoint
from .runtime import PipelineRuntime, RuntimeResult
from .torch_pipelining import TorchPipeliningResult, run_torch_pipelining

__all__ = ["PipelineRuntime", "RuntimeResult", "channels", "consistent_cut", "save_checkpoint", "load_checkpoint",
           "read_header", "CheckpointError", "run_torch_pipelining", "TorchPipeliningResult"]
