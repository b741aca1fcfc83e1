"""TensorBoard summaries: ``summarize_scalar`` / ``summarize_tensor`` and the event files.

``cstorch.summarize_scalar(name, value)`` inside a traced step writes ``value`` to the
``SummaryWriter`` given as ``DataExecutor(writer=...)``, after the step, on activation
steps, at step ``writer.base_step + iteration`` (1-based by default, as in cstorch).
Without a writer it does nothing. ``SummaryWriter`` writes standard TensorBoard event
files through tensorboardX (no torch or TensorFlow); ``SummaryReader`` reads them back
through TensorBoard's own event reader, which checks every record's checksums, and
needs the ``tensorboard`` extra. The same names live at ``cstorch.utils.tensorboard``.
"""

from ._reader import ScalarEvent as ScalarEvent
from ._reader import SummaryError as SummaryError
from ._reader import SummaryReader as SummaryReader
from ._reader import TensorEvent as TensorEvent
from ._summarize import summarize_scalar as summarize_scalar
from ._summarize import summarize_tensor as summarize_tensor
from ._writer import SummaryWriter as SummaryWriter
