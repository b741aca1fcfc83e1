"""``cerebras.appliance.environment``: cerebrax's minimal stand-in for the environment part
of Cerebras' appliance package, present only under the cstorch alias.

On Cerebras' cluster, :data:`appliance_environ` holds environment variables for the
appliance's worker processes, where the input pipeline runs; Model Zoo sets
``TOKENIZERS_PARALLELISM`` and the Hugging Face cache folders (``HF_HOME``,
``TRANSFORMERS_CACHE``, ``HF_DATASETS_CACHE``) in it. With cerebrax the input pipeline runs
in this process and in the DataLoader workers it starts, which inherit its environment, so
:data:`appliance_environ` is :data:`os.environ` itself.
"""

from __future__ import annotations

import os

__all__ = ["appliance_environ"]

appliance_environ = os.environ
