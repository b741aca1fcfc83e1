"""``cerebras.appliance`` under the cstorch alias: cerebrax's minimal stand-in for Cerebras'
appliance package (``cerebrax/_alias/cerebras/appliance``).

Model Zoo imports names from ``cerebras.appliance`` on the import chain of its models. These
tests check that every name it uses imports under the alias and means what Model Zoo needs
(logger names, levels, storage by path, H5 checkpoint metadata, debug args files, byte
units, subclass lists, symlinks), that ``s3://`` paths are refused with the fix, that
``import cerebrax`` alone does not make ``cerebras.appliance`` importable, and that a real
``cerebras.appliance`` installed elsewhere is loaded in the stand-in's place.

The alias is never turned on in this process: each check runs in its own interpreter.
Most run in one interpreter (the ``probe`` fixture), which prints its results as JSON.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALIAS = ROOT / "cerebrax" / "_alias"
STAND_IN = ALIAS / "cerebras" / "appliance"

# The names Model Zoo imports from cerebras.appliance (grep of its source).
MODEL_ZOO_NAMES = [
    "log.ClassLogger", "log.named_class_logger", "log.get_level_name", "log.wsc_logger",
    "log.collect_wsc_log_settings", "logger", "errors.ApplianceNanError",
    "errors.ApplianceCompilationError", "errors.ApplianceDeadlockError",
    "errors.ApplianceUnknownError", "errors.ClusterJobCancelledByCsctl",
    "environment.appliance_environ", "cluster.client.TelemetryClient",
    "storage.StorageReader", "storage.StorageWriter", "storage.StorageDeleter",
    "storage.H5Reader", "storage.S3Reader", "storage.S3Writer",
    "storage.base_storage.StorageDeleter", "storage.h5_storage.H5Writer",
    "storage.s3_storage.S3Deleter", "utils.classes.retrieve_all_subclasses",
    "utils.debug_args.DebugArgs", "utils.debug_args.get_debug_args",
    "utils.debug_args.update_debug_args_from_keys", "utils.debug_args.write_debug_args",
    "utils.file.create_symlink", "utils.ini.set_default_ini", "utils.ini.set_ini",
    "utils.units.bytes_to_human", "utils.units.convert_byte_unit",
]


def _env(*extra: pathlib.Path) -> dict[str, str]:
    """A child's environment: this checkout, then ``extra``, on its path; no alias (the
    child turns it on)."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ALIAS)]
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *map(str, extra), *parts])
    return env


def _python(tmp_path: pathlib.Path, code: str, *args: str, env=None, runner=()):
    script = tmp_path / "check.py"
    script.write_text(code)
    return subprocess.run([sys.executable, *runner, str(script), *args], cwd=tmp_path,
                          env=env or _env(), capture_output=True, text=True, timeout=180)


def _last_json(done) -> dict:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------- one interpreter, many checks

_PROBE = r'''
import importlib, json, logging, os, pathlib, pickle, sys
import cerebrax
cerebrax.enable_cstorch_alias()
import cerebras.pytorch as cstorch

tmp = pathlib.Path(sys.argv[1])
NAMES = json.loads(sys.argv[2])
out = {}


def section(fn):
    try:
        out[fn.__name__] = fn()
    except Exception as error:  # reported, so that the other sections still run
        out[fn.__name__] = {"error": f"{type(error).__name__}: {error}"}
    return fn


@section
def names():
    found = {}
    for name in NAMES:
        module, _, attr = f"cerebras.appliance.{name}".rpartition(".")
        value = getattr(importlib.import_module(module), attr)
        found[name] = getattr(value, "__module__", None) or type(value).__module__
    return found


@section
def units():
    from cerebras.appliance.utils.units import bytes_to_human, convert_byte_unit
    sizes = [0, 1, 1023, 1024, 1536, 1048575, 10 * 2**20, 10 * 2**30, 2**60, 512.5, -2048]
    conversions = [(10, "B", "GiB"), (10, "B", "GB"), (5, "B", "MB"), (3, "B", "kib"),
                   (1536, "KiB", "B"), (1, "GiB", "MiB"), (2, "TB", "TB"), (1.5, "B", "KiB")]
    bad = []
    for args in [(1, "B", "GiG"), (1, "B", ""), (1, "bits", "B")]:
        try:
            convert_byte_unit(args[0], args[1], src_unit=args[2])
        except ValueError as error:
            bad.append(str(error))
    return {"human": [bytes_to_human(s) for s in sizes],
            "convert": [[convert_byte_unit(v, t, src_unit=s),
                         type(convert_byte_unit(v, t, src_unit=s)).__name__]
                        for v, t, s in conversions],
            "default_src": convert_byte_unit(2048, "KiB"), "bad": bad}


@section
def subclasses():
    from cerebras.appliance.utils.classes import retrieve_all_subclasses
    class A: pass
    class B(A): pass
    class C(B): pass
    class D(A): pass
    class E(B, D): pass  # reached twice, listed once
    class F(C): pass
    every = [B, C, D, E, F]
    names = lambda classes: [k.__name__ for k in classes]
    return {"A": names(retrieve_all_subclasses(A)), "B": names(retrieve_all_subclasses(B)),
            "F": names(retrieve_all_subclasses(F)),
            "closed_A": sorted(k.__name__ for k in every if issubclass(k, A) and k is not A),
            "closed_B": sorted(k.__name__ for k in every if issubclass(k, B) and k is not B),
            "lr": sorted(k.__name__ for k in retrieve_all_subclasses(
                cstorch.optim.lr_scheduler.LRScheduler))[:3]}


@section
def symlink():
    from cerebras.appliance.utils.file import create_symlink
    logs = tmp / "cerebras_logs"
    (logs / "run_1").mkdir(parents=True)
    (logs / "run_2").mkdir()
    (logs / "run_1" / "run.log").write_text("first")
    (logs / "run_2" / "run.log").write_text("second")
    latest = logs / "latest"
    # As Model Zoo's ArtifactDirCallback: a relative target, replaced on every run.
    create_symlink(latest, pathlib.Path("run_1"), target_is_directory=True)
    first = [os.readlink(latest), (latest / "run.log").read_text()]
    create_symlink(latest, pathlib.Path("run_2"), target_is_directory=True)
    second = [os.readlink(latest), (latest / "run.log").read_text()]
    create_symlink(str(logs / "latest_run.log"), os.path.relpath(logs / "run_2" / "run.log",
                                                                  logs))
    leftovers = sorted(p.name for p in logs.iterdir())
    try:
        create_symlink(tmp / "no_such_folder" / "link", "x")
        missing = None
    except OSError as error:
        missing = type(error).__name__
    return {"first": first, "second": second, "leftovers": leftovers,
            "log": (logs / "latest_run.log").read_text(), "missing_folder": missing}


@section
def loggers():
    from cerebras.appliance import logger
    from cerebras.appliance.log import (ClassLogger, collect_wsc_log_settings, get_level_name,
                                        named_class_logger, wsc_logger)

    class CoreCallback:  # a base of Model Zoo's own, before ClassLogger in the bases
        pass

    @named_class_logger("RunSchedule")
    class RunSchedule(CoreCallback, ClassLogger):
        def name(self):
            return self.logger.name

    @named_class_logger
    class Bare(ClassLogger):
        pass

    @named_class_logger()
    class Called(ClassLogger):
        pass

    @named_class_logger("cerebras.Kept")
    class Kept(ClassLogger):
        pass

    class Plain(ClassLogger):
        pass

    class Sub(RunSchedule):
        pass

    levels = {str(v): get_level_name(v) for v in
              ["info", "INFO", "debug", "Warning", "error", "verbose", "TRACE", "10", 20, 15, 5,
               40]}
    try:
        get_level_name("loud")
        bad = None
    except ValueError as error:
        bad = str(error)
    wsc_logger.setLevel(logging.DEBUG)
    wsc_logger.getChild("act").setLevel(get_level_name("verbose"))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    settings = collect_wsc_log_settings()
    logger.removeHandler(handler)
    return {"RunSchedule": RunSchedule().name(), "is_logger": isinstance(
                RunSchedule.logger, logging.Logger) and RunSchedule().logger is RunSchedule.logger,
            "Bare": Bare.logger.name, "Called": Called.logger.name, "Kept": Kept.logger.name,
            "Plain": Plain().logger.name, "Sub": Sub().logger.name, "root": logger.name,
            "same_root": logger is logging.getLogger("cerebras"), "wsc": wsc_logger.name,
            "levels": levels, "bad": bad, "settings": settings,
            "warned": [r.getMessage() for r in records]}


@section
def storage():
    import h5py
    import numpy as np
    from cerebras.appliance.storage import (H5Reader, S3Reader, S3Writer, StorageDeleter,
                                            StorageReader, StorageWriter)
    from cerebras.appliance.storage.h5_storage import H5Writer
    from cerebras.appliance.storage.s3_storage import S3Deleter

    small = tmp / "small.h5"
    with h5py.File(small, "w") as f:
        f.attrs["__cstorch_version__"] = "2.4.0"
        f.attrs["step"] = np.int64(7)
        f.attrs["ok"] = True
        f.attrs["shape"] = np.array([2, 3])
        f["w"] = np.ones(3)
    reader = StorageReader.get(small)
    ckpt = tmp / "ckpt.mdl"
    cerebrax.save({"model": {"w": np.arange(4.0)}, "step": 3}, str(ckpt))
    saved = H5Reader(str(ckpt))
    result = {
        "type": type(reader).__name__, "get_type_is_h5": StorageReader.get_type(small) is H5Reader,
        "metadata": reader.global_metadata,
        "size": reader.fstat.st_size == small.stat().st_size,
        "mtime": reader.fstat.st_mtime == small.stat().st_mtime,
        "ckpt_version": saved.global_metadata.get("__cerebrax_version__"),
        "version": cerebrax.__version__,
        "valid": [StorageWriter.is_valid_path(str(tmp / "x.mdl")), StorageWriter.is_valid_path(tmp),
                  H5Writer.is_valid_path(str(tmp)), H5Writer.is_valid_path("s3://b/k"),
                  S3Writer.is_valid_path(str(tmp)), S3Writer.is_valid_path("s3://b/k"),
                  S3Writer.is_valid_path(pathlib.Path("s3://b/k")),
                  S3Deleter.is_valid_path(str(ckpt)), S3Reader.is_valid_path("gs://b/k"),
                  StorageReader.is_valid_path("gs://b/k")],
        "exists": [StorageWriter.path_exists(str(ckpt)), StorageReader.path_exists(tmp / "no.h5")],
    }
    StorageDeleter.get(str(ckpt)).delete()
    result["deleted"] = [ckpt.exists(), StorageDeleter.path_exists(str(ckpt))]
    try:
        H5Reader(str(tmp / "no.h5"))
    except FileNotFoundError as error:
        result["missing"] = str(error)
    try:
        StorageReader.get_type("gs://bucket/ckpt.mdl")
    except cerebrax.errors.ConfigError as error:
        result["unknown"] = str(error)
    return result


@section
def s3():
    from cerebras.appliance.storage import S3Reader, S3Writer, StorageDeleter, StorageReader
    from cerebras.appliance.storage.s3_storage import S3Deleter
    path = "s3://bucket/run/checkpoint_10.mdl"
    calls = {"S3Reader(path)": lambda: S3Reader(path),
             "S3Writer(path)": lambda: S3Writer(path),
             "S3Deleter(path).delete()": lambda: S3Deleter(path).delete(),
             "S3Reader.path_exists": lambda: S3Reader.path_exists(path),
             "StorageReader.path_exists": lambda: StorageReader.path_exists(path),
             "StorageDeleter.get": lambda: StorageDeleter.get(path).delete()}
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = None
        except Exception as error:
            found[name] = [type(error).__name__, isinstance(error, cerebrax.errors.ConfigError),
                           str(error)]
    return found


@section
def debug_args():
    from cerebras.appliance.utils.debug_args import (DebugArgs, get_debug_args,
                                                     update_debug_args_from_keys,
                                                     write_debug_args)
    from cerebras.appliance.utils.ini import set_default_ini, set_ini
    # Model Zoo's update_runconfig_debug_args_path: defaults, written, read back.
    path = tmp / ".debug_args.proto"
    args = DebugArgs()
    set_default_ini(args, ws_cv_auto_inis=True, ws_opt_target_max_actv_wios=16,
                    ws_opt_bidir_act=False)
    write_debug_args(args, str(path))
    again = get_debug_args(str(path))
    first = again == args and again is not args
    # run_gpt_inference: extra keys and INIs; set_default_ini keeps what is set.
    update_debug_args_from_keys(again, {"debug_mgr.labels.team": "ml",
                                        "debug_usr": {"skip_x": True, "ratio": 0.5}})
    set_ini(again, ws_opt_bidir_act=True, ws_name="a \"quoted\"\nname",
            ws_opt_target_max_actv_wios=8)
    set_default_ini(again, ws_opt_bidir_act=False, ws_new=3)
    write_debug_args(again, str(path))
    text = path.read_text()
    third = get_debug_args(path)
    # DebugArgsPath: merged into the backend's debug args.
    merged = DebugArgs({"debug_mgr": {"labels": {"owner": "me"}}, "ini": {"ints": {"x": 1}}})
    merged.MergeFrom(third)
    try:
        merged.MergeFrom({"ini": {}})
        merge_error = None
    except TypeError as error:
        merge_error = str(error)
    try:
        set_ini(again, bad=[1])
        ini_error = None
    except TypeError as error:
        ini_error = str(error)
    # A file as Cerebras' tools write it (map entries, nested messages, comments).
    cerebras_file = tmp / "cerebras.proto"
    cerebras_file.write_text(
        '# written by hand\n'
        'debug_mgr {\n  labels {\n    key: "team"\n    value: "ml"\n  }\n}\n'
        'ini {\n  bools {\n    key: "ws_x"\n    value: true\n  }\n'
        '  ints < key: "ws_n" value: -0x10 >\n  floats { key: "ws_f" value: 1.5e-3 }\n}\n'
        'debug_crd: { level: VERBOSE tags: ["a", "b"] }\n')
    broken = tmp / "broken.proto"
    broken.write_text("ini {\n  bools {\n")
    try:
        get_debug_args(broken)
        parse_error = None
    except ValueError as error:
        parse_error = str(error)
    return {"first": first, "defaults": args.to_dict(),
            "third": third.to_dict(), "text": text, "merged": merged.to_dict(),
            "empty": [get_debug_args(None).to_dict(), get_debug_args("").to_dict(),
                      get_debug_args(third) is third],
            "cerebras": get_debug_args(cerebras_file).to_dict(), "merge_error": merge_error,
            "ini_error": ini_error, "parse_error": parse_error,
            "repr": repr(DebugArgs({"ini": {"bools": {"a": True}}}))}


@section
def telemetry():
    from cerebras.appliance.cluster.client import TelemetryClient
    client = TelemetryClient(mgmt_client=None, max_buffer_size=5)
    with client as entered:
        entered.push(metrics={"auto_restart_job": 1}, labels={"job_id": "wsjob-1"})
        entered.push({"loss": 0.5}, labels={"step": "10"})
    positional = TelemetryClient(object(), 128, 150)
    try:
        client.push([("loss", 1.0)])
        error = None
    except TypeError as e:
        error = str(e)
    return {"entered": entered is client, "sizes": [client.max_buffer_size,
            client.max_buffer_seconds, positional.max_buffer_size,
            positional.max_buffer_seconds], "error": error}


@section
def errors():
    from cerebras.appliance import errors as e
    classes = [e.ApplianceNanError, e.ApplianceCompilationError, e.ApplianceDeadlockError,
               e.ApplianceUnknownError, e.ClusterJobCancelledByCsctl]
    raised = e.ApplianceNanError("NaN loss detected. Check the data.")
    back = pickle.loads(pickle.dumps(raised))
    return {"bases": [issubclass(k, e.ApplianceClientException) and issubclass(k, Exception)
                      for k in classes],
            "distinct": not any(issubclass(a, b) for a in classes for b in classes
                                if a is not b),
            "pickled": [type(back).__name__, str(back), "NaN" in str(back)]}


@section
def environ():
    from cerebras.appliance.environment import appliance_environ
    appliance_environ["CEREBRAX_PROBE"] = "1"
    return {"is_os_environ": appliance_environ is os.environ,
            "set": os.environ.get("CEREBRAX_PROBE")}


@section
def alias():
    import cerebras, cerebras.appliance
    return {"cstorch": cstorch is cerebrax,
            "file": os.path.realpath(cerebras.appliance.__file__),
            "bound": cerebras.appliance is sys.modules["cerebras.appliance"]}


print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("appliance")
    return _last_json(_python(tmp, _PROBE, str(tmp), json.dumps(MODEL_ZOO_NAMES)))


def _section(probe: dict, name: str):
    result = probe[name]
    assert not (isinstance(result, dict) and set(result) == {"error"}), result
    return result


def test_every_name_model_zoo_uses_imports_under_the_alias(probe):
    modules = _section(probe, "names")
    assert list(modules) == MODEL_ZOO_NAMES
    # The classes and functions are the stand-in's own; `logger` and `wsc_logger` are
    # logging.Logger objects, appliance_environ is os.environ, and DebugArgs is the class
    # of cstorch.backends.csx.debug.debug_args (cerebrax.backend's).
    for name, module in modules.items():
        if name == "utils.debug_args.DebugArgs":
            assert module == "cerebrax.backend._debug_args", name
        elif name in ("logger", "log.wsc_logger"):
            assert module == "logging", name
        elif name == "environment.appliance_environ":
            assert module == "os", name
        else:
            assert module.startswith("cerebras.appliance."), (name, module)
    alias = _section(probe, "alias")
    assert alias == {"cstorch": True, "file": str(STAND_IN / "__init__.py"), "bound": True}


def test_every_module_says_it_is_cerebraxs_stand_in_under_the_alias():
    modules = sorted(STAND_IN.rglob("*.py"))
    assert len(modules) >= 16
    for path in modules:
        doc = " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split())
        assert "cerebrax's minimal stand-in for" in doc, path
        assert "present only under the cstorch alias" in doc, path
    assert not (ALIAS / "cerebras" / "__init__.py").exists()  # still a namespace package


def test_importing_cerebrax_alone_does_not_make_cerebras_appliance_importable(tmp_path):
    code = ("import importlib, json, sys\nimport cerebrax\nfound = {}\n"
            "for name in ['cerebras.appliance', 'cerebras.appliance.log']:\n"
            "    try:\n        importlib.import_module(name)\n        found[name] = True\n"
            "    except ModuleNotFoundError:\n        found[name] = False\n"
            "print(json.dumps(found))\n")
    assert _last_json(_python(tmp_path, code)) == {"cerebras.appliance": False,
                                                    "cerebras.appliance.log": False}


def test_cerebrax_run_gives_the_stand_in_to_a_script(tmp_path):
    code = ("import json\nimport cerebras.pytorch as cstorch\n"
            "from cerebras.appliance.log import ClassLogger, named_class_logger\n"
            "@named_class_logger('Trainer')\nclass Trainer(ClassLogger):\n    pass\n"
            "print(json.dumps([cstorch.__name__, Trainer.logger.name]))\n")
    done = _python(tmp_path, code, runner=("-m", "cerebrax", "run"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["cerebrax", "cerebras.Trainer"]


def test_bytes_to_human_and_convert_byte_unit(probe):
    units = _section(probe, "units")
    assert units["human"] == ["0 B", "1 B", "1023 B", "1.00 KiB", "1.50 KiB", "1.00 MiB",
                              "10.00 MiB", "10.00 GiB", "1.00 EiB", "512.5 B", "-2.00 KiB"]
    # Model Zoo's convert_file_size_to_int: "10GiB" -> 10737418240, "10GB" -> 10**10.
    assert units["convert"] == [[10 * 2**30, "int"], [10 * 10**9, "int"], [5 * 10**6, "int"],
                                [3 * 1024, "int"], [1.5, "float"], [1 / 1024, "float"],
                                [2, "int"], [1536, "int"]]
    assert units["default_src"] == 2
    assert len(units["bad"]) == 3 and all("Unknown byte unit" in m for m in units["bad"])


def test_retrieve_all_subclasses_lists_every_subclass_once(probe):
    found = _section(probe, "subclasses")
    assert found["A"] == ["B", "C", "F", "E", "D"]  # depth first, definition order
    assert sorted(found["A"]) == found["closed_A"]
    assert found["B"] == ["C", "F", "E"] and sorted(found["B"]) == found["closed_B"]
    assert found["F"] == []
    assert found["lr"]  # cerebrax's LR schedulers, as Model Zoo lists them


def test_create_symlink_makes_and_replaces_relative_links(probe):
    found = _section(probe, "symlink")
    assert found["first"] == ["run_1", "first"]
    assert found["second"] == ["run_2", "second"]
    assert found["log"] == "second"
    assert found["leftovers"] == ["latest", "latest_run.log", "run_1", "run_2"]
    assert found["missing_folder"] == "FileNotFoundError"


def test_class_loggers_get_the_names_model_zoo_gives_them(probe):
    found = _section(probe, "loggers")
    assert found["RunSchedule"] == "cerebras.RunSchedule" and found["is_logger"]
    assert found["Sub"] == "cerebras.RunSchedule"  # inherited, as a class attribute
    assert found["Bare"] == "cerebras.__main__.Bare"
    assert found["Called"] == "cerebras.__main__.Called"
    assert found["Kept"] == "cerebras.Kept"
    assert found["Plain"] == found["root"] == "cerebras" and found["same_root"]
    assert found["wsc"] == "cerebras.wsc"


def test_log_levels_and_wsc_settings(probe):
    found = _section(probe, "loggers")
    assert found["levels"] == {"info": 20, "INFO": 20, "debug": 10, "Warning": 30,
                               "error": 40, "verbose": 15, "TRACE": 5, "10": 10, "20": "INFO",
                               "15": "VERBOSE", "5": "TRACE", "40": "ERROR"}
    assert "Invalid logging level 'loud'" in found["bad"] and "VERBOSE" in found["bad"]
    assert found["settings"] == {"": 10, "act": 15}
    assert len(found["warned"]) == 1 and "no effect" in found["warned"][0]
    assert "act=VERBOSE" in found["warned"][0]


def test_h5_checkpoints_by_path(probe):
    found = _section(probe, "storage")
    assert found["type"] == "H5Reader" and found["get_type_is_h5"]
    assert found["metadata"] == {"__cstorch_version__": "2.4.0", "step": 7, "ok": True,
                                 "shape": [2, 3]}
    assert found["size"] and found["mtime"]
    assert found["ckpt_version"] == found["version"]  # a checkpoint cerebrax.save wrote
    assert found["valid"] == [True, True, True, False, False, True, True, False, False, False]
    assert found["exists"] == [True, False]
    assert found["deleted"] == [False, False]
    assert "No H5 checkpoint file" in found["missing"]
    assert "'gs://bucket/ckpt.mdl'" in found["unknown"] and "H5Reader, S3Reader" in found["unknown"]


def test_an_s3_path_is_refused_with_the_fix(probe):
    found = _section(probe, "s3")
    assert set(found) == {"S3Reader(path)", "S3Writer(path)", "S3Deleter(path).delete()",
                          "S3Reader.path_exists", "StorageReader.path_exists",
                          "StorageDeleter.get"}
    for call, (kind, is_config_error, message) in found.items():
        assert kind == "ConfigError" and is_config_error, call
        assert "'s3://bucket/run/checkpoint_10.mdl' is an S3 path" in message, call
        assert "cerebrax has no S3 storage" in message
        assert "aws s3 cp s3://bucket/run/checkpoint_10.mdl ./" in message
        assert "mount the bucket" in message


def test_debug_args_record_merge_and_round_trip_files(probe):
    found = _section(probe, "debug_args")
    assert found["defaults"] == {"ini": {"bools": {"ws_cv_auto_inis": True,
                                                   "ws_opt_bidir_act": False},
                                         "ints": {"ws_opt_target_max_actv_wios": 16}}}
    assert found["third"] == {
        "ini": {"bools": {"ws_cv_auto_inis": True, "ws_opt_bidir_act": True},
                "ints": {"ws_opt_target_max_actv_wios": 8, "ws_new": 3},
                "strings": {"ws_name": 'a "quoted"\nname'}},
        "debug_mgr": {"labels": {"team": "ml"}},
        "debug_usr": {"skip_x": True, "ratio": 0.5}}
    assert found["first"]
    # INI maps are written as protobuf map entries.
    assert 'bools {\n    key: "ws_cv_auto_inis"\n    value: true\n  }' in found["text"]
    assert 'value: "a \\"quoted\\"\\nname"' in found["text"]
    assert found["merged"] == {
        "debug_mgr": {"labels": {"owner": "me", "team": "ml"}},
        "ini": {"ints": {"x": 1, "ws_opt_target_max_actv_wios": 8, "ws_new": 3},
                "bools": {"ws_cv_auto_inis": True, "ws_opt_bidir_act": True},
                "strings": {"ws_name": 'a "quoted"\nname'}},
        "debug_usr": {"skip_x": True, "ratio": 0.5}}
    assert found["empty"] == [{}, {}, True]
    assert found["cerebras"] == {
        "debug_mgr": {"labels": {"team": "ml"}},
        "ini": {"bools": {"ws_x": True}, "ints": {"ws_n": -16}, "floats": {"ws_f": 0.0015}},
        "debug_crd": {"level": "VERBOSE", "tags": ["a", "b"]}}
    assert "expects a DebugArgs, got dict" in found["merge_error"]
    assert "INI 'bad'=[1] is a list" in found["ini_error"]
    assert "broken.proto" in found["parse_error"] and "ends" in found["parse_error"]
    assert found["repr"] == "DebugArgs({'ini': {'bools': {'a': True}}})"


def test_telemetry_client_is_a_context_manager_that_sends_nothing(probe):
    found = _section(probe, "telemetry")
    assert found["entered"] and found["sizes"] == [5, 150, 128, 150]
    assert "metrics must be a mapping" in found["error"]


def test_appliance_errors_form_one_hierarchy_and_pickle(probe):
    found = _section(probe, "errors")
    assert found["bases"] == [True] * 5 and found["distinct"]
    assert found["pickled"] == ["ApplianceNanError", "NaN loss detected. Check the data.", True]


def test_appliance_environ_is_this_processs_environment(probe):
    assert _section(probe, "environ") == {"is_os_environ": True, "set": "1"}


# ------------------------------------------------------------------ a real package elsewhere

_REAL = """
import json, os, sys
import cerebrax
cerebrax.enable_cstorch_alias()
import cerebras.pytorch as cstorch
import cerebras.appliance
import cerebras.appliance.log
from cerebras.appliance.log import get_level_name
import cerebras
try:
    from cerebras.appliance.log import ClassLogger
    stand_in_name = True
except ImportError:
    stand_in_name = False
print(json.dumps({
    "real": getattr(cerebras.appliance, "REAL", False),
    "file": os.path.realpath(cerebras.appliance.__file__),
    "log": os.path.realpath(cerebras.appliance.log.__file__),
    "level": get_level_name("x"),
    "bound": cerebras.appliance is sys.modules["cerebras.appliance"],
    "stand_in_name": stand_in_name, "cstorch": cstorch is cerebrax}))
"""


def _real_package(site: pathlib.Path, init: str) -> pathlib.Path:
    package = site / "cerebras" / "appliance"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "log.py").write_text("def get_level_name(level):\n    return 'real'\n")
    return package


def test_a_real_cerebras_appliance_elsewhere_is_loaded_in_the_stand_ins_place(tmp_path):
    """Cerebras' own package installed alone (no cerebras.pytorch): the stand-in, first on
    the path, loads it in its place; its submodules are the real ones too."""
    package = _real_package(tmp_path / "site", "REAL = True\nfrom . import log\n")
    found = _last_json(_python(tmp_path, _REAL, env=_env(tmp_path / "site")))
    assert found == {"real": True, "file": str(package / "__init__.py"),
                     "log": str(package / "log.py"), "level": "real", "bound": True,
                     "stand_in_name": False, "cstorch": True}


def test_a_real_cerebras_appliance_that_fails_to_import_says_so(tmp_path):
    _real_package(tmp_path / "site", "import numpy\nraise ImportError('numpy 1.25 needed')\n")
    done = _python(tmp_path, _REAL, env=_env(tmp_path / "site"))
    assert done.returncode == 1
    assert "ImportError: numpy 1.25 needed" in done.stderr
    assert "cerebrax's stand-in defers to it" in done.stderr
    assert "Uninstall cerebras_appliance" in done.stderr
