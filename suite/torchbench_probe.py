"""The import check of TorchBench models, run inside the environment under test.

Run by path with that environment's interpreter (``python suite/torchbench_probe.py ...``), so
it needs the standard library only, plus whatever the models themselves import:

    python torchbench_probe.py identity
    python torchbench_probe.py freeze
    python torchbench_probe.py libraries NAME...
    python torchbench_probe.py check --root ROOT --out FILE [--devices cpu,cuda]
                                     [--timeout SECONDS] NAME...

``identity`` prints the environment's identity as JSON (:func:`identity`), ``freeze`` its
installed distributions as constraints (:func:`freeze`), ``libraries`` why each named module
does not import (:func:`import_error`, JSON). ``check`` imports
``torchbenchmark.models.<NAME>`` for each name in turn and appends one JSON line per model to
``FILE`` (a ``start`` line first, so a caller whose batch timed out or crashed knows which model
was running): whether it imported, and if not the exception, the missing module and the library
it came from (:func:`describe_exception`); if it did, what TorchBench's own construction decides
for each (test, device): the batch size the model runs with, or its ``NotImplementedError``.

The construction stops right after TorchBench's ``BenchmarkModel._determine_batch_size``
(``torchbenchmark/util/model.py``): by then the model's ``__init__`` has run its own overrides
(BERT_pytorch divides its CPU eval batch size by 8 before calling the base) and the base has
raised ``NotImplementedError`` for a test without a batch size (llama's train), while no module,
data or weights have been built yet.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import signal
import site
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

TESTS = ("train", "eval")
_GIT_VERSION = re.compile(r"""^git_version\s*=\s*['"]([0-9a-fA-F]+)['"]""", re.MULTILINE)


def _torch_version() -> tuple[str | None, str | None]:
    """``(version, git commit)`` of the installed torch, read from its files: importing torch
    takes seconds and is not needed to know which build it is."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    spec = importlib.util.find_spec("torch")  # a top-level spec imports nothing
    commit = None
    if spec is not None and spec.origin:
        path = Path(spec.origin).parent / "version.py"
        if path.is_file():
            found = _GIT_VERSION.search(path.read_text(errors="replace"))
            commit = found.group(1) if found else None
    return version, commit


def identity() -> dict[str, Any]:
    """What an import check's result depends on besides the model: the environment's prefix,
    the Python implementation and version, torch's version and git commit, a hash of every
    installed distribution's ``name==version``, and a hash of this file (a check made by an
    older probe is not reused); ``id`` is a 16-hex-digit hash of the rest."""
    # The environment's own site-packages only: what the working directory or PYTHONPATH puts
    # on sys.path (a checkout's egg-info) differs between processes of one environment.
    packages = sorted(
        f"{(d.metadata['Name'] or '').lower()}=={d.version}"
        for d in importlib.metadata.distributions(path=site.getsitepackages())
    )
    torch_version, torch_git = _torch_version()
    out: dict[str, Any] = {
        "prefix": sys.prefix,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "torch": torch_version,
        "torch_git": torch_git,
        "packages": hashlib.sha256("\n".join(packages).encode()).hexdigest()[:16],
        "probe": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16],
    }
    out["id"] = hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()[:16]
    return out


def freeze() -> list[str]:
    """``name==version`` of every installed distribution, sorted: constraints that keep what is
    installed where it is."""
    found = {
        (d.metadata["Name"] or "").lower(): d.version for d in importlib.metadata.distributions()
    }
    return [f"{name}=={version}" for name, version in sorted(found.items()) if name]


def import_error(module: str) -> str | None:
    """Why ``import module`` fails here (``not installed``, or ``Type: message``), None when it
    imports."""
    if importlib.util.find_spec(module) is None:
        return "not installed"
    try:
        importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - a broken build fails in many ways
        return describe_exception(exc, os.getcwd())["error"]
    return None


def _stdlib_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return [os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths]


def _top_module(filename: str, entries: list[str]) -> str | None:
    """The top-level module a source file belongs to, by the ``sys.path`` entry holding it."""
    real = os.path.realpath(filename)
    for entry in entries:
        if real.startswith(entry + os.sep):
            first = Path(real[len(entry) + 1 :]).parts[0]
            return first[:-3] if first.endswith(".py") else first
    return None


def describe_exception(exc: BaseException, root: str) -> dict[str, Any]:
    """What made an import fail: ``error`` (``Type: last line of the message``),
    ``missing_module`` (the top-level name of a ``ModuleNotFoundError``, else None) and
    ``library`` (the third-party top-level package of the outermost traceback frame outside the
    checkout and the standard library, e.g. ``torchvision`` for a torchvision whose operators
    do not load; None when the failure is in the checkout's own code)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    message = lines[-1].strip() if lines else ""
    missing = None
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        missing = exc.name.split(".")[0]
    root_real = os.path.realpath(root)
    skip = [root_real, *_stdlib_dirs()]
    entries = sorted(
        {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)} - {root_real},
        key=len,
        reverse=True,
    )
    library = None
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if name.startswith("<") or name == __file__:
            continue
        real = os.path.realpath(name)
        if any(real.startswith(s + os.sep) for s in skip):
            continue
        library = _top_module(name, entries)
        if library:
            break
    return {
        "error": f"{type(exc).__name__}: {message}" if message else type(exc).__name__,
        "missing_module": missing,
        "library": library,
    }


class _Sized(Exception):
    """Raised right after TorchBench decided the batch size: the construction stops there."""

    def __init__(self, size: Any) -> None:
        super().__init__(size)
        self.size = size


def construct(cls: type, test: str, device: str, root: str) -> dict[str, Any]:
    """What TorchBench's construction decides for (test, device): ``{"batch_size": n}``,
    ``{"not_implemented": message}``, or ``{"error": ...}`` for any other failure (data or
    weights it could not find, a bug), see the module docstring."""
    base = next((c for c in cls.__mro__ if "_determine_batch_size" in vars(c)), None)
    if base is None:
        return {"error": "no _determine_batch_size in the model's bases (not TorchBench's)"}
    original = vars(base)["_determine_batch_size"]

    def sized(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        raise _Sized(getattr(self, "batch_size", None))

    base._determine_batch_size = sized  # type: ignore[attr-defined]
    try:
        cls(test=test, device=device, batch_size=None, extra_args=[])
    except _Sized as done:
        return {"batch_size": done.size}
    except NotImplementedError as exc:
        return {"not_implemented": f"NotImplementedError: {exc}".rstrip(": ")}
    except _TimedOut:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure is the finding
        return {"error": describe_exception(exc, root)["error"]}
    finally:
        base._determine_batch_size = original  # type: ignore[attr-defined]
    return {"error": "constructed without deciding a batch size"}


NEEDS = "needs "  # how the reason of a model that imports but lacks what building it needs starts
_FROM_PRETRAINED = re.compile(r"""from_pretrained\(\s*["']([^"']+)["']""")


def huggingface_config_gap(name: str, cls: type) -> str | None:
    """What a TorchBench HuggingFace model needs from the network when it is built here: its
    config, which TorchBench's ``download_model`` reads with ``from_pretrained("<repo>")``
    (``HUGGINGFACE_MODELS`` in ``torchbenchmark/util/framework/huggingface/basic_configs.py``;
    ``<name>_generate`` uses ``<name>``'s), when ``config.json`` of that repository is not in
    the local HuggingFace cache (``huggingface_hub.try_to_load_from_cache``). None when it is
    cached, when the model builds its config from code, or when it is not such a model. The
    import check stops construction at the batch size decision, before the download, so
    without this a model whose config never downloaded (hf_T5_generate has no install.py of
    its own) is listed available and fails every night at the download."""
    if not getattr(cls, "HF_MODEL", False):
        return None
    base = name[: -len("_generate")] if name.endswith("_generate") else name
    try:
        from huggingface_hub import try_to_load_from_cache
        from torchbenchmark.util.framework.huggingface.basic_configs import HUGGINGFACE_MODELS
    except Exception:  # noqa: BLE001 - another layout of TorchBench: nothing to say
        return None
    entry = HUGGINGFACE_MODELS.get(base)
    match = _FROM_PRETRAINED.search(str(entry[2])) if entry and len(entry) > 2 else None
    if match is None:
        return None
    repository = match.group(1)
    if isinstance(try_to_load_from_cache(repository, "config.json"), str):
        return None
    return (
        f"{NEEDS}huggingface.co: the config of {repository!r} is not in the local HuggingFace "
        "cache (TorchBench downloads it when the model is built; `nightbench torchbench "
        "install` with network caches it)"
    )


class _TimedOut(BaseException):
    """SIGALRM during one model's check (a BaseException: a model's ``except Exception`` must
    not swallow it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise _TimedOut()


def probe(name: str, devices: list[str], root: str, timeout_s: int = 0) -> dict[str, Any]:
    """Import one model and construct it for each test on each device (see the module
    docstring); a device this process cannot use is reported as skipped. With ``timeout_s``,
    a check still running after that many seconds is stopped by SIGALRM and reported as
    ``timed_out`` (one blocked in C code ignores it: the caller's own limit ends that)."""
    started = time.monotonic()
    if timeout_s:
        signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(timeout_s)
    try:
        return _probe(name, devices, root, started)
    except _TimedOut:
        return {
            "name": name,
            "imported": False,
            "timed_out": True,
            "seconds": round(time.monotonic() - started, 3),
            "error": f"timed out after {timeout_s} s",
            "missing_module": None,
            "library": None,
        }
    finally:
        if timeout_s:
            signal.alarm(0)


def _probe(name: str, devices: list[str], root: str, started: float) -> dict[str, Any]:
    try:
        module = importlib.import_module(f"torchbenchmark.models.{name}")
    except _TimedOut:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a model too
        return {
            "name": name,
            "imported": False,
            "seconds": round(time.monotonic() - started, 3),
            **describe_exception(exc, root),
        }
    cls = getattr(module, "Model", None)
    if not isinstance(cls, type):
        return {
            "name": name,
            "imported": False,
            "error": f"torchbenchmark.models.{name} has no class Model",
            "missing_module": None,
            "library": None,
        }
    gap = huggingface_config_gap(name, cls)
    if gap is not None:
        return {
            "name": name,
            "imported": True,
            "seconds": round(time.monotonic() - started, 3),
            "needs": gap,
            "configs": {},
        }
    configs: dict[str, Any] = {}
    for device in devices:
        usable = device == "cpu"
        if device == "cuda":
            import torch

            usable = torch.cuda.is_available()
        for test in TESTS:
            key = f"{test}:{device}"
            if not usable:
                configs[key] = {"skipped": f"device {device!r} is not available here"}
            else:
                configs[key] = construct(cls, test, device, root)
    return {
        "name": name,
        "imported": True,
        "seconds": round(time.monotonic() - started, 3),
        "configs": configs,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); exits 0 once every model was reported."""
    parser = argparse.ArgumentParser(prog="torchbench_probe")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("identity")
    check = sub.add_parser("check")
    check.add_argument("--root", required=True)
    check.add_argument("--out", required=True)
    check.add_argument("--devices", default="cpu")
    check.add_argument("--timeout", type=int, default=0, help="seconds per model (0: none)")
    check.add_argument("names", nargs="+")
    sub.add_parser("freeze")
    libraries = sub.add_parser("libraries")
    libraries.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "identity":
        print(json.dumps(identity()))
        return 0
    if args.command == "freeze":
        print("\n".join(freeze()))
        return 0
    if args.command == "libraries":
        print(json.dumps({name: import_error(name) for name in args.names}))
        return 0
    root = os.path.realpath(args.root)
    sys.path.insert(0, root)
    devices = [d for d in args.devices.split(",") if d]
    # torch's own import (seconds on a loaded host) is the batch's, not the first model's.
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a torch that fails to import fails each model's import
        pass
    with open(args.out, "a") as out:
        for name in args.names:
            out.write(json.dumps({"name": name, "event": "start"}) + "\n")
            out.flush()
            out.write(json.dumps(probe(name, devices, root, args.timeout)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    # Run by path, this file's folder (suite/) heads sys.path, where its models/ and model.py
    # would shadow a checkout's or a library's modules of those names.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    sys.exit(main())
