"""Seed 002's Estimator workflow on JAX: ``model_fn`` + ``input_fn``, train / evaluate /
compile, checkpoints in ``model_dir``. Each step is one ``cstorch.trace`` program."""

from ._config import RunConfig as RunConfig
from ._estimator import Estimator as Estimator
from ._spec import EstimatorSpec as EstimatorSpec
from ._spec import ModeKeys as ModeKeys
