"""``cerebras.appliance.utils``: cerebrax's minimal stand-in for the utilities of Cerebras'
appliance package, present only under the cstorch alias: :mod:`.classes`,
:mod:`.debug_args`, :mod:`.file`, :mod:`.ini` and :mod:`.units`."""
