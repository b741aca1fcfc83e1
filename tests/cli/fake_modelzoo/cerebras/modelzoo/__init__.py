"""A stand-in for Cerebras Model Zoo (``cerebras.modelzoo``) in cerebrax's tests: its
registry and config interface, and one tiny model (see ../../README.md)."""
