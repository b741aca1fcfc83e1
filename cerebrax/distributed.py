"""``cstorch.distributed``: the cluster configuration."""

from .backend import ClusterConfig as ClusterConfig
