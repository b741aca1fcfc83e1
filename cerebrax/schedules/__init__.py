"""Closed-form learning-rate schedules and the ``LRScheduler`` classes.

Re-exported as ``cerebrax.optim.lr_scheduler``.
"""

from ._base import LRScheduler as LRScheduler
from ._closed_form import Schedule as Schedule
from ._closed_form import constant as constant
from ._closed_form import cosine_decay as cosine_decay
from ._closed_form import linear as linear
from ._closed_form import polynomial as polynomial
from ._schedulers import ConstantLR as ConstantLR
from ._schedulers import CosineDecayLR as CosineDecayLR
from ._schedulers import LinearLR as LinearLR
from ._schedulers import PolynomialLR as PolynomialLR
