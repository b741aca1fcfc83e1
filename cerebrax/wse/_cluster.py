"""``ClusterConfig``: the description of the (emulated) Cerebras cluster of a run."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from .._filters import check_int
from ..errors import ConfigError

__all__ = ["APPLIANCE_FIELDS", "ClusterConfig", "EXECUTION_MODES", "PIPELINE_SCHEDULES",
           "parse_bytes"]

#: The execution modes of the emulated wafer: ``ClusterConfig(execution_mode=...)``.
EXECUTION_MODES = ("weight_streaming", "pipeline", "replica", "sharded")
#: How pipeline mode orders its ticks: ``ClusterConfig(pipeline_schedule=...)``.
PIPELINE_SCHEDULES = ("gpipe", "circular")
#: The backend strings of ``cstorch.compile(model, backend="wse_ws")`` and the execution
#: mode each selects.
MODE_ALIASES = {
    "wse_ws": "weight_streaming",
    "wse_pipeline": "pipeline",
    "wse_replica": "replica",
    "wse_sharded": "sharded",
}


def _check_int(name: str, value: object, minimum: int, *, optional: bool = False) -> None:
    check_int(f"ClusterConfig.{name}", value, ge=minimum, optional=optional)


def _check_strings(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(
            f"ClusterConfig.{name} must be a list of strings, got {value!r}."
        )


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """The cluster a CSX run uses.

    The fields are those of cstorch's ``ClusterConfig``. ``execution_mode`` and the
    fields after it choose how the emulated wafer lays out the model over the JAX
    devices: ``"weight_streaming"`` (the default: parameters sharded over
    ``max_wgt_servers``), ``"pipeline"`` (``num_stages`` layer stages, micro-batches of
    ``micro_batch_size``), ``"replica"`` (``num_replicas`` data-parallel copies) or
    ``"sharded"`` (the state sharded over ``max_wgt_servers`` as in weight streaming, the
    model run as one global-view program whose collectives XLA's partitioner chooses:
    what weight streaming falls back to for models without layers).
    With more than one visible device, a CSX backend lays the run out on a device
    mesh (see :mod:`cerebrax.wse`) of ``num_csx`` x (``num_replicas`` |
    ``max_wgt_servers`` | ``num_stages``) devices. In pipeline mode ``num_stages=None``
    means one stage and ``micro_batch_size=None`` means ``num_stages`` micro-batches
    per system. In weight-streaming and replica mode a ``micro_batch_size`` makes each
    model call process every system's rows in micro-batches of that size, one after
    the other, recomputing their activations in the backward pass (less activation
    memory, the same gradients for a model without coupling between rows; see
    :mod:`cerebrax.wse`). With one visible device every configuration runs on it, so a script
    written for a cluster runs on a laptop.

    The appliance fields of cstorch 2.10 (:data:`APPLIANCE_FIELDS`: ``mgmt_address``,
    ``credentials_path``, ``cbcore_image``, ``job_priority``, ...) are accepted and kept,
    so a ported script's config builds, but nothing in cerebrax applies them (there is
    no appliance to reach); :meth:`appliance_settings` lists the ones set, and the
    compile report records them. As in cstorch 2.10, ``max_wgt_servers=0`` and
    ``max_act_per_csx=0`` (or None) let the system choose: cerebrax's defaults.

    Example:
      >>> import cerebrax as cstorch
      >>> cfg = cstorch.distributed.ClusterConfig(num_csx=1, num_workers_per_csx=2)
      >>> cfg.execution_mode
      'weight_streaming'
    """

    num_csx: int = 1
    max_wgt_servers: int = 24
    num_workers_per_csx: int = 1
    max_act_per_csx: int = 1
    transfer_processes: int = 5
    mount_dirs: Sequence[str] | None = None
    python_paths: Sequence[str] | None = None
    job_labels: Sequence[str] | None = None
    execution_mode: str = "weight_streaming"
    num_stages: int | None = None
    num_replicas: int | None = None
    micro_batch_size: int | None = None
    # cerebrax's own fields (not in cstorch): the pipeline schedule and a per-device
    # memory budget checked before a step runs.
    pipeline_schedule: str = "gpipe"
    pipeline_repeats: int | None = None
    device_memory: int | str | None = None
    # cstorch 2.10's appliance fields: accepted and recorded, not applied.
    mgmt_address: str | None = None
    mgmt_namespace: str | None = None
    credentials_path: str | None = None
    cbcore_image: str | None = None
    job_priority: str | None = None
    job_time_sec: int | None = None
    automount: bool | None = None
    mount_all: bool | None = None
    disable_mount_check: bool | None = None
    disable_version_check: bool | None = None
    workflow_id: str | None = None
    notifications: Any = None

    def __post_init__(self) -> None:
        for name, default in (("num_csx", 1), ("num_workers_per_csx", 1),
                              ("transfer_processes", 5)):
            if getattr(self, name) is None:  # cstorch scripts pass config.get(...)
                object.__setattr__(self, name, default)
        for name, default in (("max_wgt_servers", 24), ("max_act_per_csx", 1)):
            if getattr(self, name) is None or type(getattr(self, name)) is int \
                    and getattr(self, name) == 0:
                object.__setattr__(self, name, default)  # 0: the system chooses
        _check_int("num_csx", self.num_csx, 1)
        _check_int("max_wgt_servers", self.max_wgt_servers, 1)
        _check_int("num_workers_per_csx", self.num_workers_per_csx, 0)
        _check_int("max_act_per_csx", self.max_act_per_csx, 1)
        _check_int("transfer_processes", self.transfer_processes, 1)
        for name in ("mount_dirs", "python_paths", "job_labels"):
            _check_strings(name, getattr(self, name))
        for label in self.job_labels or ():
            if "=" not in label:
                raise ConfigError(
                    f"ClusterConfig.job_labels entries are 'key=value' strings; "
                    f"{label!r} has no '='."
                )
        mode = MODE_ALIASES.get(self.execution_mode, self.execution_mode)
        if mode not in EXECUTION_MODES:
            raise ConfigError(
                f"ClusterConfig.execution_mode must be one of {EXECUTION_MODES}, "
                f"got {self.execution_mode!r}."
            )
        object.__setattr__(self, "execution_mode", mode)
        _check_int("num_stages", self.num_stages, 1, optional=True)
        _check_int("num_replicas", self.num_replicas, 1, optional=True)
        _check_int("micro_batch_size", self.micro_batch_size, 1, optional=True)
        if self.num_stages is not None and mode != "pipeline":
            raise ConfigError(
                f"ClusterConfig.num_stages={self.num_stages} only applies to "
                f"execution_mode='pipeline', not {mode!r}."
            )
        if self.num_replicas is not None and mode != "replica":
            raise ConfigError(
                f"ClusterConfig.num_replicas={self.num_replicas} only applies to "
                f"execution_mode='replica', not {mode!r}."
            )
        self._check_pipeline_schedule(mode)
        if self.device_memory is not None:
            object.__setattr__(self, "device_memory", parse_bytes(
                self.device_memory, "ClusterConfig.device_memory"))
        for name in ("mgmt_address", "mgmt_namespace", "credentials_path", "cbcore_image",
                     "job_priority", "workflow_id"):
            _check_optional(name, getattr(self, name), str, "a string")
        for name in ("automount", "mount_all", "disable_mount_check",
                     "disable_version_check"):
            _check_optional(name, getattr(self, name), bool, "a bool")
        _check_int("job_time_sec", self.job_time_sec, 0, optional=True)

    def _check_pipeline_schedule(self, mode: str) -> None:
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ConfigError(
                f"ClusterConfig.pipeline_schedule must be one of {PIPELINE_SCHEDULES}, "
                f"got {self.pipeline_schedule!r}."
            )
        _check_int("pipeline_repeats", self.pipeline_repeats, 1, optional=True)
        if self.pipeline_schedule != "gpipe" and mode != "pipeline":
            raise ConfigError(
                f"ClusterConfig.pipeline_schedule={self.pipeline_schedule!r} only applies "
                f"to execution_mode='pipeline', not {mode!r}."
            )
        if self.pipeline_repeats is not None and self.pipeline_schedule != "circular":
            raise ConfigError(
                f"ClusterConfig.pipeline_repeats={self.pipeline_repeats} (layer chunks per "
                f"stage device) only applies to pipeline_schedule='circular', not "
                f"{self.pipeline_schedule!r}. Fix: add pipeline_schedule='circular' or drop "
                "pipeline_repeats."
            )

    def appliance_settings(self) -> dict[str, Any]:
        """The appliance fields that were set (recorded, not applied by cerebrax)."""
        return {name: getattr(self, name) for name in APPLIANCE_FIELDS
                if getattr(self, name) is not None}


# Fields that only a Cerebras appliance uses; cerebrax keeps and reports them.
APPLIANCE_FIELDS = ("mgmt_address", "mgmt_namespace", "credentials_path", "cbcore_image",
                    "job_priority", "job_time_sec", "automount", "mount_all",
                    "disable_mount_check", "disable_version_check", "workflow_id",
                    "notifications")


def parse_bytes(value: object, name: str) -> int:
    """A byte count from an int or a size string (``"16GiB"``, ``"512 MB"``, ``"2e9"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be a byte count or a size string such as "
                          f"'16GiB', got {value!r}.")
    pydantic, byte_size = _byte_size()
    try:
        size = int(byte_size.validate_python(value))
    except pydantic.ValidationError:
        raise ConfigError(
            f"{name}={value!r} is not a size. Fix: give bytes as an int or a string "
            "such as '16GiB', '512MiB' or '8GB' (GiB/MiB are powers of 2, GB/MB of 10)."
        ) from None
    if size <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}.")
    return size


@functools.cache
def _byte_size() -> tuple[Any, Any]:
    """pydantic and its ByteSize parser, imported at the first size string (pydantic
    costs about 0.1 s to import, which most scripts need not pay)."""
    import pydantic

    return pydantic, pydantic.TypeAdapter(pydantic.ByteSize)


def _check_optional(name: str, value: object, kind: type, what: str) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(f"ClusterConfig.{name} must be {what} or None, got {value!r}.")
