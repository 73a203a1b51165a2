"""The errors of a training run."""


class TrainingError(RuntimeError):
    """A run that cannot start or continue (bad options, a foreign run directory)."""


class OptionsError(TrainingError):
    """Options that do not fit together or with the run directory (a usage error)."""


class NonFiniteLoss(TrainingError):
    """The loss, the gradient, the parameters or the optimiser state became NaN / inf; nothing
    was saved for that step."""
