"""The process-wide backend ("CPU", "GPU" or "CSX") and the run configuration."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax

from .. import _fork_server, _startup_gc, _step
from .._filters import check_int, is_torch_tensor
from .._runtime import RUNTIME
from .._step import to_numpy, to_torch
from ..errors import BackendError, ConfigError, TensorReadError
from ..wse import MODE_ALIASES, ClusterConfig, Layout, build_wafer
from . import _compile_cache
from ._device import BackendDevice
from ._flags import apply_flags

__all__ = [
    "Backend",
    "BackendType",
    "RunConfig",
    "backend",
    "configure",
    "current_backend",
    "current_torch_device",
    "reset",
    "run_config",
    "use_cs",
]

BACKEND_TYPES = ("CPU", "GPU", "CSX")


class BackendType(enum.StrEnum):
    """The kinds of backend: ``CPU``, ``GPU`` and ``CSX``. A member is also the string of
    its name (``BackendType.CPU == "CPU"``): ``Backend.backend_type`` holds one, and
    ``cstorch.backend`` takes either."""

    CPU = "CPU"
    GPU = "GPU"
    CSX = "CSX"

    @classmethod
    def from_str(cls, name: str) -> BackendType:
        """The type named ``name`` (case-insensitive)."""
        try:
            return cls[str(name).upper()]
        except KeyError:
            raise ConfigError(f"Unknown backend type {name!r}. Expected one of "
                              f"{[t.name for t in cls]} (case-insensitive).") from None

    @property
    def is_cpu(self) -> bool:
        """Whether this is ``BackendType.CPU``."""
        return self is BackendType.CPU

    @property
    def is_gpu(self) -> bool:
        """Whether this is ``BackendType.GPU``."""
        return self is BackendType.GPU

    @property
    def is_csx(self) -> bool:
        """Whether this is ``BackendType.CSX``."""
        return self is BackendType.CSX


MSG_SECOND_BACKEND = """\
Cannot instantiate multiple backends: a {old} backend already exists in this process
and a {new} backend was requested. cerebrax runs one backend per process.
  - to get the existing backend, call cstorch.backend() with no arguments;
  - to start over (tests, notebooks), call cstorch.reset() first, then create the
    model, optimizer and schedulers again."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """The fields of ``cstorch.configure`` (seed API), fixed once per process."""

    model_dir: str = "./"
    compile_dir: str | None = None
    compile_only: bool = False
    validate_only: bool = False
    checkpoint_steps: int = 0
    cluster_config: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)


class Backend:
    """Where and how traced steps run. Create it with :func:`backend`.

    Attributes:
      backend_type: ``"CPU"``, ``"GPU"`` or ``"CSX"``.
      device: the device that holds state and runs steps, a
        :class:`~cerebrax.backend.BackendDevice`: it compares equal to its JAX device
        and is cstorch's context manager (``with backend.device: model = Model()``
        hands the model's weights to ``compile`` without keeping a second copy).
      jax_device: that JAX device itself (on a wafer mesh, the first mesh device of
        this process: state starts there and is laid out on the mesh by the first
        step).
      cluster_config: the :class:`ClusterConfig` of a CSX backend (with the
        ``cstorch.backends.csx`` flags that apply to it applied), else None.
      artifact_dir: where compile artifacts and executor logs are written.
      compile_dir: where ``compile_only`` artifacts are written; when given, it also
        holds JAX's persistent compilation cache (``jax_cache``), which lets a second
        run load its steps instead of compiling them (by default the cache is in
        ``~/.cache/cerebrax/jax_cache``; ``CEREBRAX_COMPILE_CACHE=0`` turns it off).
      compile_cache_dir: the compilation cache's directory in use (the first one set
        in this process), None where it is off.
      compile_only: lower and compile steps, write artifacts, run nothing.
      validate_only: trace steps abstractly, compile and run nothing.
      allow_recompile: let a step compile again for new input shapes (debugging).
      wafer: the :class:`cerebrax.wse.Wafer` mesh of a multi-device CSX backend, else None.
      layout: the :class:`cerebrax.wse.Layout` (state and batch shardings), else None.
    """

    def __init__(
        self,
        backend_type: str,
        *,
        artifact_dir: str | None = None,
        compile_dir: str | None = None,
        compile_only: bool = False,
        validate_only: bool = False,
        cluster_config: ClusterConfig | None = None,
        allow_recompile: bool = False,
        device: jax.Device | None = None,
    ):
        self.backend_type = backend_type
        self.artifact_dir = os.path.abspath(artifact_dir or "./cerebras_logs")
        self.compile_dir = os.path.abspath(
            compile_dir or os.path.join(self.artifact_dir, "compile")
        )
        self.compile_cache_dir = _compile_cache.enable(
            self.compile_dir if compile_dir is not None else None)
        if self.compile_cache_dir is not None and RUNTIME.export_cache_dir is None:
            RUNTIME.export_cache_dir = os.path.join(self.compile_cache_dir, "torch_export")
        if compile_only and validate_only:
            raise ConfigError(
                "compile_only and validate_only are exclusive: validate_only traces "
                "without compiling, compile_only compiles without running."
            )
        self.compile_only = bool(compile_only)
        self.validate_only = bool(validate_only)
        self._cluster_config = cluster_config
        self.allow_recompile = bool(allow_recompile)
        _startup_gc.hold()  # until the first step (start-up makes little garbage)
        # DataLoader workers fork from a copy of this process taken before JAX's
        # runtime starts, which the first device lookup does.
        _fork_server.start()
        jax_device = device if device is not None else _default_device(backend_type)
        self.generation = _step.current_generation()
        # A CSX backend whose ClusterConfig spans several devices runs on a wafer mesh.
        self.wafer = None
        self.layout = None
        if backend_type == "CSX" and cluster_config is not None and device is None:
            self.wafer = build_wafer(self.cluster_config)
            if self.wafer is not None:
                self.layout = Layout(self.wafer)
                jax_device = _local_mesh_device(self.wafer)
            elif jax.process_count() > 1:
                raise ConfigError(MSG_ONE_DEVICE_MULTIPROCESS.format(
                    mode=cluster_config.execution_mode, csx=cluster_config.num_csx,
                    n=jax.process_count(), total=jax.device_count()))
        self.jax_device = jax_device
        self.device = BackendDevice(backend_type, jax_device)

    @property
    def cluster_config(self) -> ClusterConfig | None:
        """The CSX backend's ClusterConfig, with ``cstorch.backends.csx`` flags that
        apply to it (``performance.micro_batch_size``) applied; None on CPU and GPU."""
        return apply_flags(self._cluster_config)

    @property
    def cluster(self) -> ClusterConfig | None:
        """The cluster this backend runs on: its :attr:`cluster_config`."""
        return self.cluster_config

    @property
    def is_cpu(self) -> bool:
        """Whether this is a CPU backend."""
        return self.backend_type == "CPU"

    @property
    def is_gpu(self) -> bool:
        """Whether this is a GPU backend."""
        return self.backend_type == "GPU"

    @property
    def is_csx(self) -> bool:
        """Whether this is a CSX backend (one device, or a wafer mesh of several)."""
        return self.backend_type == "CSX"

    @property
    def _impl(self) -> Backend:
        """cstorch's backend implementation object, which cstorch code reads through
        ``backend._impl`` (Model Zoo: ``backend._impl.is_e2e_execution``). In cerebrax the
        backend is its own implementation."""
        return self

    @property
    def is_e2e_execution(self) -> bool:
        """Whether steps run (False in compile-only and validate-only runs)."""
        return not (self.compile_only or self.validate_only)

    @property
    def is_tracing(self) -> bool:
        """Whether a traced step is being built now (its code runs on traced values)."""
        return _step.active_context() is not None

    @property
    def torch_device(self) -> Any:
        """The torch device of the run's torch tensors: always the CPU, since the
        state and the steps live in JAX (on :attr:`jax_device`)."""
        return self.device.torch_device

    def lowering(self) -> contextlib.AbstractContextManager:
        """The block in which a program for this backend is traced: torch modules'
        graphs are lowered for its platform (the attention kernel depends on it)."""
        if "torch_bridge" not in sys.modules:
            return contextlib.nullcontext()
        from torch_bridge import lowering_platform

        return lowering_platform(self.jax_device.platform)

    def to_cpu(self, tensor: Any) -> Any:
        """A host copy of ``tensor`` (or of every array in a tree of them).

        A torch tensor comes back as a CPU torch tensor, a JAX array as a numpy array
        (a host sync point: it waits for the step that computes it). Inside a traced
        step values are not known yet: pass them to a step closure instead.

        Raises:
          TensorReadError: called on a value of a step being traced.
        """
        return jax.tree.map(_to_cpu, tensor, is_leaf=is_torch_tensor)

    def __repr__(self) -> str:
        return f"Backend({str(self.backend_type)!r}, device={self.jax_device})"


def _to_cpu(x: Any) -> Any:
    value = x.__jax_array__() if is_torch_tensor(x) and hasattr(x, "__jax_array__") else x
    if isinstance(value, jax.core.Tracer):
        raise TensorReadError(
            "backend.to_cpu() got a value of a traced step, which is only known once the "
            "step runs. Pass it to a @cstorch.step_closure, which receives it on the host."
        )
    if is_torch_tensor(x) and value is x:
        return x.detach().cpu()
    if isinstance(value, jax.Array):
        array = to_numpy(value)  # host sync point
        return array if value is x else to_torch(array, x.dtype)
    return x


def _default_device(backend_type: str) -> jax.Device:
    # This process's own device: in a multi-process run jax.devices() starts with
    # process 0's devices, which the other processes cannot hold values on.
    if backend_type == "CPU":
        return jax.local_devices(backend="cpu")[0]
    if backend_type == "GPU":
        try:
            return jax.local_devices(backend="gpu")[0]
        except RuntimeError as e:
            raise ConfigError(
                "backend('GPU') found no GPU visible to JAX. Install a CUDA build of "
                "jaxlib, or use backend('CPU')."
            ) from e
    return jax.local_devices()[0]


MSG_PROCESS_LEFT_OUT = """\
The {wafer!r} mesh of ClusterConfig(execution_mode={mode!r}, num_csx={csx}, ...) uses
{size} of the {total} devices of this {n}-process run and leaves out process(es) {left}:
every process must hold part of the mesh. Fix: ask for all {total} devices (e.g. with
num_csx={csx}, num_replicas or max_wgt_servers = {hint}), or start fewer processes."""


MSG_ONE_DEVICE_MULTIPROCESS = """\
ClusterConfig(execution_mode={mode!r}, num_csx={csx}, ...) lays the run out on one
device, but this is a {n}-process run (cstorch.distributed.initialize): every process
would train the whole model alone. Fix: ask for a mesh over all {total} devices, e.g.
ClusterConfig(execution_mode="replica", num_replicas={total}) or
ClusterConfig(max_wgt_servers={total}), or run a single process."""


def _local_mesh_device(wafer: Any) -> jax.Device:
    """The first mesh device this process owns (the home of state before placement).

    Raises:
      ConfigError: (on every process) the mesh leaves out a process of the run.
    """
    from .._placement import local_device

    devices = list(wafer.mesh.devices.flat)
    left = sorted(set(range(jax.process_count())) - {d.process_index for d in devices})
    if left:
        raise ConfigError(MSG_PROCESS_LEFT_OUT.format(
            wafer=wafer, mode=wafer.mode, csx=wafer.num_csx, size=wafer.size,
            total=jax.device_count(), n=jax.process_count(), left=left,
            hint=jax.device_count() // wafer.num_csx,
        ))
    return local_device(devices)


def _check_type(backend_type: Any) -> BackendType:
    if not isinstance(backend_type, str) or backend_type.upper() not in BACKEND_TYPES:
        raise ConfigError(
            f"Invalid Cerebras PyTorch backend type specified: {backend_type!r}. "
            f"Expected one of {list(BACKEND_TYPES)} (case-insensitive)."
        )
    return BackendType(backend_type.upper())


def backend(backend_type: str | BackendType | None = None, *args: Any,
            **kwargs: Any) -> Backend | None:
    """Creates the process's backend, or returns it when called with no arguments.

    Args:
      backend_type: ``"CPU"``, ``"GPU"`` or ``"CSX"`` (case-insensitive), or a
        :class:`BackendType`.
      *args: at most one, ``artifact_dir``, as cstorch takes it.
      **kwargs: CPU: ``artifact_dir``, ``allow_recompile``, ``cluster_config``
        (accepted as cstorch accepts it, and unused: there is no wafer to lay out).
        GPU: those plus ``enable_distributed``, ``main_process_id``, ``dist_backend``,
        ``init_method``, ``sync_batchnorm``. CSX: ``artifact_dir``, ``compile_dir``,
        ``compile_only``, ``validate_only``, ``cluster_config``, ``allow_recompile``.

    Returns:
      The new :class:`Backend`; with no arguments the existing one, or None.

    Example:
      >>> import cerebrax as cstorch
      >>> cstorch.reset()
      >>> cstorch.backend("CPU").backend_type == "CPU"
      True
    """
    if backend_type is None:
        if args or kwargs:
            raise BackendError(
                "backend() got arguments but no backend type. Pass the type first: "
                "cstorch.backend('CSX', cluster_config=...)."
            )
        return RUNTIME.backend
    if len(args) > 1 or (args and "artifact_dir" in kwargs):
        raise ConfigError(
            f"backend({str(backend_type)!r}, ...) takes one positional option, artifact_dir, "
            f"and the others as keyword arguments; got {len(args)} positional argument(s)"
            + (" and artifact_dir=" if args and "artifact_dir" in kwargs else "") + "."
        )
    if args:
        kwargs["artifact_dir"] = args[0]
    kind = _check_type(backend_type)
    if RUNTIME.backend is not None:
        raise BackendError(MSG_SECOND_BACKEND.format(old=RUNTIME.backend.backend_type,
                                                     new=kind))
    options = _validate_options(kind, dict(kwargs))
    new = Backend(kind, **options)
    RUNTIME.backend = new
    _step.set_state_device(new.jax_device)
    return new


# cluster_config is taken by every backend, as cstorch's are (a script such as gigaGPT
# passes its ClusterConfig whatever the backend); only CSX lays a model out with it.
_COMMON = {"artifact_dir", "allow_recompile", "cluster_config"}
_ALLOWED = {
    "CPU": _COMMON,
    "GPU": _COMMON
    | {"enable_distributed", "main_process_id", "dist_backend", "init_method", "sync_batchnorm"},
    "CSX": _COMMON | {"compile_dir", "compile_only", "validate_only"},
}


def _validate_options(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    if "mixed_precision" in options:
        raise ConfigError(
            f"backend({kind!r}) does not take mixed_precision. Use "
            "cstorch.amp.set_half_dtype('float16' | 'bfloat16' | 'float32') instead."
        )
    unknown = sorted(set(options) - _ALLOWED[kind])
    if unknown:
        raise ConfigError(
            f"backend({kind!r}) got unknown option(s) {unknown}. "
            f"Allowed: {sorted(_ALLOWED[kind])}."
        )
    for gpu_only in ("enable_distributed", "main_process_id", "dist_backend",
                     "init_method", "sync_batchnorm"):
        if options.pop(gpu_only, None):
            raise ConfigError(
                f"backend('GPU', {gpu_only}=...) is not supported by cerebrax: a GPU run "
                "uses one device; multi-device runs use the CSX backend's ClusterConfig."
            )
    cluster = options.get("cluster_config")
    if cluster is not None and not isinstance(cluster, ClusterConfig):
        raise ConfigError(
            f"backend({kind!r}, cluster_config=...) expects a "
            f"cstorch.distributed.ClusterConfig, got {type(cluster).__name__}."
        )
    if kind != "CSX":
        options.pop("cluster_config", None)  # no wafer to lay out: nothing to configure
        return options
    if cluster is None:
        cluster = run_config().cluster_config
    options["cluster_config"] = cluster
    config = run_config()
    options.setdefault("compile_dir", config.compile_dir)
    options["compile_only"] = options.get("compile_only") or config.compile_only
    options["validate_only"] = options.get("validate_only") or config.validate_only
    return options


def current_backend(raise_exception: bool = True, raise_warning: bool = True) -> Backend | None:
    """The active backend; raises (or returns None) when there is none."""
    del raise_warning  # cstorch warns that this function is deprecated; cerebrax keeps it.
    if RUNTIME.backend is not None:
        return RUNTIME.backend
    if raise_exception:
        raise BackendError(
            "No active Cerebras backend found. Create one with cstorch.backend('CPU') "
            "or cstorch.backend('CSX', cluster_config=...), or pass a backend to "
            "cstorch.compile(model, backend)."
        )
    return None


def current_torch_device() -> Any:
    """The torch device of the current backend's torch tensors: the CPU (also without a
    backend), since cerebrax keeps state and runs steps in JAX."""
    import torch

    return torch.device("cpu")


def use_cs() -> bool:
    """Whether the current backend is a CSX backend (False without a backend)."""
    current = RUNTIME.backend
    return current is not None and current.is_csx


def get_or_create_backend(spec: Backend | str | None) -> Backend:
    """Resolves the ``backend`` argument of ``cstorch.compile``."""
    if isinstance(spec, Backend):
        if RUNTIME.backend is not spec:
            raise BackendError(
                "Compile got a different backend than the currently initialized backend. "
                "Pass the backend returned by cstorch.backend(...), or pass nothing."
            )
        return spec
    if spec is None:
        return RUNTIME.backend or backend("CPU")
    if not isinstance(spec, str):
        raise ConfigError(
            f"compile(model, backend=...) expects a Backend or one of "
            f"{list(BACKEND_TYPES) + list(MODE_ALIASES)}, got {type(spec).__name__}."
        )
    mode = MODE_ALIASES.get(spec.lower())
    kind = "CSX" if mode else _check_type(spec)
    if RUNTIME.backend is not None:
        existing = RUNTIME.backend
        if existing.backend_type != kind:
            raise BackendError(
                f"compile(model, {spec!r}) asks for a {kind} backend, but a "
                f"{existing.backend_type} backend is active. Use one backend per process."
            )
        if mode and existing.cluster_config.execution_mode != mode:
            raise BackendError(
                f"compile(model, {spec!r}) asks for execution_mode={mode!r}, but the "
                f"active CSX backend uses {existing.cluster_config.execution_mode!r}."
            )
        return existing
    if mode:
        cluster = dataclasses.replace(run_config().cluster_config, execution_mode=mode)
        return backend("CSX", cluster_config=cluster)
    return backend(kind)


def configure(
    model_dir: str = "./",
    compile_dir: str | None = None,
    compile_only: bool = False,
    validate_only: bool = False,
    checkpoint_steps: int = 0,
    num_csx: int = 1,
    max_wgt_servers: int = 24,
    mount_dirs: Sequence[str] | None = None,
    python_paths: Sequence[str] | None = None,
    transfer_processes: int = 5,
    num_workers_per_csx: int = 1,
    job_labels: Sequence[str] | None = None,
    max_act_per_csx: int = 1,
) -> RunConfig:
    """Configures the run once per process, before the model is created (seed API).

    The cluster fields build the :class:`ClusterConfig` that a CSX backend created
    later uses; ``checkpoint_steps`` is the default of every ``DataExecutor`` and of
    iterating a ``DataLoader`` directly.
    """
    if RUNTIME.run_config is not None:
        raise BackendError(
            "cstorch.configure() was already called in this process. It configures the "
            "run once, globally; run a different configuration in a separate process "
            "(or call cstorch.reset() first in tests and notebooks)."
        )
    if RUNTIME.backend is not None:
        raise BackendError(
            "cstorch.configure() must be called before the backend is created "
            f"(a {RUNTIME.backend.backend_type} backend exists already)."
        )
    if _step.live_refs():
        raise BackendError(
            "cstorch.configure() must be called before the model is instantiated: "
            "move it to the top of the script, before building the model."
        )
    check_int("configure(checkpoint_steps=...)", checkpoint_steps, ge=0)
    if compile_only and validate_only:
        raise ConfigError("configure(): compile_only and validate_only are exclusive.")
    cluster = ClusterConfig(
        num_csx=num_csx,
        max_wgt_servers=max_wgt_servers,
        num_workers_per_csx=num_workers_per_csx,
        max_act_per_csx=max_act_per_csx,
        transfer_processes=transfer_processes,
        mount_dirs=mount_dirs,
        python_paths=python_paths,
        job_labels=job_labels,
    )
    config = RunConfig(
        model_dir=model_dir,
        compile_dir=compile_dir,
        compile_only=bool(compile_only),
        validate_only=bool(validate_only),
        checkpoint_steps=checkpoint_steps,
        cluster_config=cluster,
    )
    RUNTIME.run_config = config
    return config


def run_config() -> RunConfig:
    """The configuration given to ``configure`` (defaults if it was not called)."""
    return RUNTIME.run_config or RunConfig()


def reset() -> None:
    """Drops the backend, the configuration and all registered state, and forgets what
    the process recorded (annotations, ``set_attribute`` calls, debug names, warnings
    given once).

    For tests and notebooks: afterwards ``configure`` and ``backend`` may be called
    again. Models, optimizers, schedulers and metrics created before the reset can
    no longer be used; create them again. Queued step closures are dropped and data
    streams stopped (see :class:`cerebrax._runtime.Runtime`).
    """
    RUNTIME.reset()
