"""``cerebras.appliance.cluster``: cerebrax's minimal stand-in for the cluster part of
Cerebras' appliance package, present only under the cstorch alias: only
:class:`~cerebras.appliance.cluster.client.TelemetryClient` (see there)."""
