"""Training an aligner: ``pfamalign train``.

* ``step``: the optimiser, the training state, the pure jitted train step and the
  data-parallel mesh helpers;
* ``loop``: ``run``, the training loop (data from ``pipelines.reader``, resume, the cadence
  of logging / validation (``pfamalign.evaluation``) / checkpoints, the non-finite guard,
  signals);
* ``rundir``: the run directory's config (new, resumed or refused), ``metrics.jsonl`` /
  TensorBoard and the progress line.
"""

from pfamalign.training.errors import NonFiniteLoss, OptionsError, TrainingError
from pfamalign.training.loop import TrainResult, run
from pfamalign.training.rundir import resolve_config, run_config

__all__ = ["NonFiniteLoss", "OptionsError", "TrainingError", "TrainResult", "resolve_config",
           "run", "run_config"]
