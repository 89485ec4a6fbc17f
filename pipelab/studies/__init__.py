"""The studies over the core: presets, runs and sweeps, tuning, the result cache, data, reference models, figures.

Everything here answers the project's questions with figures (``python -m pipelab figures``, the notebooks); the
core (:mod:`pipelab` minus this package) never imports it. Modules:

- :mod:`~pipelab.studies.settings` (every study setting: tasks, optimizer overrides, learning-rate and tuning
  grids, policy ↔ schedule arms), :mod:`~pipelab.studies.config` (presets, canonical configs),
  :mod:`~pipelab.studies.cache` (results keyed by config and code);
- :mod:`~pipelab.studies.data` (loaders and downloads), :mod:`~pipelab.studies.models` (reference models);
- :mod:`~pipelab.studies.learning_curves`, :mod:`~pipelab.studies.stacking`, :mod:`~pipelab.studies.tuning`
  (learning-curve runs, stacked seeds, learning-rate search), :mod:`~pipelab.studies.prediction_error` and
  :mod:`~pipelab.studies.calibration` (the runs over the core's measurements);
- :mod:`~pipelab.studies.figures` (the registry with provenance and one module per topic),
  :mod:`~pipelab.studies.style`, :mod:`~pipelab.studies.notebook_tools`;
- :mod:`~pipelab.studies.cli` (``python -m pipelab``) and :mod:`~pipelab.studies.run` (``torchrun -m
  pipelab.studies.run``).
"""
