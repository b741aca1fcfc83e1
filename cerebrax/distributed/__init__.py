"""``cstorch.distributed``: the cluster configuration, the data-sharding helpers, and
joining a multi-process run (``initialize``; ``get_rank`` / ``get_world_size`` are the
process's index and the number of processes), ``cluster_resolver`` (the streaming
workers' ``TaskSpec``/``ClusterSpec``) and the worker cache (``WORKER_CACHE_ROOT``).

:func:`initialize` makes one wafer mesh span several processes (hosts) through JAX's
own multi-process runtime; see :mod:`cerebrax.wse._multiprocess` for how values are
placed and read then. The data-sharding helpers answer for the streaming worker that
calls them (each worker runs ``input_fn`` in its own thread): see
:class:`cerebrax.data.DataLoader` for the idiom that gives every worker its own shard
and its own shuffle.
"""

from ..backend import ClusterConfig as ClusterConfig
from . import cluster_resolver as cluster_resolver
from ._worker_cache import WORKER_CACHE_ROOT as WORKER_CACHE_ROOT
from ._worker_cache import hit_worker_cache_limit as hit_worker_cache_limit
from .cluster_resolver import service_resolver as service_resolver
from ..data._streamers import get_ordinal as get_ordinal
from ..data._streamers import get_streaming_batch_size as get_streaming_batch_size
from ..data._streamers import get_streaming_rank as get_streaming_rank
from ..data._streamers import get_worker_state as get_worker_state
from ..data._streamers import is_master_ordinal as is_master_ordinal
from ..data._streamers import is_streamer as is_streamer
from ..data._streamers import num_receivers as num_receivers
from ..data._streamers import num_streamers as num_streamers
from ..data._streamers import num_tasks as num_tasks
from ..wse._multiprocess import initialize as initialize
from ..wse._multiprocess import shutdown as shutdown
from ..wse._multiprocess import get_rank as get_rank
from ..wse._multiprocess import get_world_size as get_world_size
