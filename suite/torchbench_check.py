"""Which TorchBench models import in the environment under test, and why the others do not.

Reading files (:mod:`suite.torchbench_checkout`) cannot tell whether a model runs: its framework
library may be missing (torch_geometric, detectron2), a library it imports may fail at import
time (a torchvision built for another torch: ``operator torchvision::nms does not exist``; a
transformers broken by a newer huggingface-hub). So a model is *available* only once it has
been imported, and its construction taken as far as TorchBench's batch size decision, in the
environment under test (:mod:`suite.torchbench_probe`, a subprocess per batch of models with a
timeout); the result is cached by the environment's identity (its prefix, Python, torch version
and commit, a hash of every installed distribution) and the model's source version
(:func:`suite.torchbench_checkout.source_version`), so it is redone only when either changes.

A model not checked in this environment yet is listed unavailable as "not checked"; a
(test, device) whose construction raised ``NotImplementedError`` or failed is not offered.
TorchBench's setup outcomes, recorded by ``nightbench torchbench install``, are kept apart, by
the environment's prefix and the checkout (:func:`setup_key`): a model whose data never
downloaded stays unavailable when another package is installed later.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from suite import torchbench_checkout as checkout
from suite import torchbench_probe
from suite.model_info import ModelInfo

PROBE = Path(__file__).with_name("torchbench_probe.py")
CACHE_ENV = "NIGHTBENCH_TORCHBENCH_CACHE"
BATCH = 8  # models per probe process: one torch import shared by several models
TIMEOUT_S = 120  # per model: the slowest real imports (hf_*) take ~20 s here
STARTUP_S = 120  # per batch, on top: the interpreter and torch's own import on a loaded host
# Libraries TorchBench's models are built from, beyond FRAMEWORK_LIBRARIES: a missing one is
# named as a missing framework library, not as any missing module.
FRAMEWORK_IMPORTS = (
    *checkout.FRAMEWORK_LIBRARIES,
    "torch_geometric",
    "torchrec",
    "fbgemm_gpu",
    "doctr",
    "segment_anything",
    "gym",
    "pytorch_lightning",
)
# Libraries built against one torch: a failure inside them at import time is a build mismatch.
TORCH_BUILT = ("torchvision", "torchaudio", "torchtext", "fbgemm_gpu")
NO_TEST = "TorchBench offers no test"  # imported, yet every (test, device) is ruled out
SETUP_FAILED = "TorchBench's setup FAILED here"  # imported, but its data or weights are missing
NEEDS = torchbench_probe.NEEDS  # imported, but building it needs what is missing here
NOT_CHECKED = (
    "not checked: its import has not been checked in this environment "
    "(python -m suite list --check-imports, or nightbench torchbench check)"
)


@dataclass(frozen=True)
class ImportCheck:
    """One model's import check in one environment.

    Attributes:
        name: TorchBench's name of the model (``hf_Bert``).
        version: its source version when checked.
        imported: whether ``torchbenchmark.models.<name>`` imported.
        cause: why it did not (:func:`cause`); for a model that imported, what it needs that
            is missing here (a HuggingFace config not in the local cache,
            :func:`suite.torchbench_probe.huggingface_config_gap`); None when it is available.
        configs: ``{"test:device": outcome}`` of the construction, each outcome one of
            ``{"batch_size": n}``, ``{"not_implemented": message}``, ``{"error": message}``,
            ``{"skipped": why}`` (a device this environment cannot use).
        seconds: how long the import and constructions took, None when unknown.
    """

    name: str
    version: str
    imported: bool
    cause: str | None = None
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The cache's JSON object for this check."""
        return {
            "name": self.name,
            "version": self.version,
            "imported": self.imported,
            "cause": self.cause,
            "configs": self.configs,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImportCheck:
        """The inverse of :meth:`to_json`."""
        return cls(
            name=data["name"],
            version=data["version"],
            imported=bool(data["imported"]),
            cause=data.get("cause"),
            configs=dict(data.get("configs") or {}),
            seconds=data.get("seconds"),
        )


def cause(result: Mapping[str, Any]) -> str:
    """Why a model's import failed, from the probe's report (``error``, ``missing_module``,
    ``library``; :func:`suite.torchbench_probe.describe_exception`), in the words a user acts
    on: a missing framework library, a missing module, a torch-built library (torchvision,
    torchaudio) that does not load with this torch, or a runtime import error in a library or
    in the model's own code."""
    error = str(result.get("error") or "unknown error")
    missing, library = result.get("missing_module"), result.get("library")
    if result.get("timed_out"):
        return f"import check {error}"
    if missing in FRAMEWORK_IMPORTS:
        return f"missing framework library {missing}: {error}"
    if missing:
        return f"missing module {missing}: {error}"
    broken = library if library in TORCH_BUILT else None
    broken = broken or next((lib for lib in TORCH_BUILT if f"{lib}::" in error), None)
    if broken:
        return (
            f"broken {broken}: {error} (a {broken} build that does not match this torch; "
            f"install the one from the PyTorch index of this torch's variant)"
        )
    if library:
        return f"runtime import error in {library}: {error}"
    return f"runtime import error: {error}"


def cache_dir() -> Path:
    """Where import checks and setup outcomes are kept: ``NIGHTBENCH_TORCHBENCH_CACHE``, else
    ``$XDG_CACHE_HOME/nightbench/torchbench-imports`` (``~/.cache`` when unset)."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nightbench" / "torchbench-imports"


def environment_identity(python: str | None = None) -> dict[str, Any]:
    """The identity of the environment of ``python`` (default: this interpreter), see
    :func:`suite.torchbench_probe.identity`.

    Raises:
        RuntimeError: ``python`` cannot be run or does not answer (its stderr in the message).
    """
    if python is None or python == sys.executable:
        return torchbench_probe.identity()
    try:
        proc = subprocess.run(
            [python, str(PROBE), "identity"], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot read the environment of {python}: {exc}") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"cannot read the environment of {python}: {proc.stderr[-1000:]}")
    return dict(json.loads(proc.stdout))


def _cache_file(env_id: str) -> Path:
    return cache_dir() / f"{env_id}.json"


def load(env_id: str) -> dict[str, ImportCheck]:
    """The checks cached for an environment (empty when none or unreadable)."""
    try:
        data = json.loads(_cache_file(env_id).read_text())
        return {n: ImportCheck.from_json(c) for n, c in data["models"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def setup_key(identity: Mapping[str, Any]) -> str:
    """The key TorchBench's setup outcomes are kept under: the environment's prefix and Python
    (from ``identity``, see :func:`environment_identity`) and the checkout's root, as a
    16-hex-digit hash. Not the installed packages: a setup's outcome is mostly where its input
    data or configs came from, which installing another package later does not change, and an
    import check still catches a model that stops importing.

    Raises:
        suite.torchbench_checkout.TorchBenchUnavailable: no checkout configured.
    """
    where = {
        "prefix": identity["prefix"],
        "python": identity["python"],
        "checkout": str(checkout.checkout_root()),
    }
    return hashlib.sha256(json.dumps(where, sort_keys=True).encode()).hexdigest()[:16]


def _setups_file(identity: Mapping[str, Any]) -> Path:
    return cache_dir() / f"setups-{setup_key(identity)}.json"


def load_setups(identity: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """TorchBench's setup outcomes recorded for an environment and checkout by ``nightbench
    torchbench install``: ``{name: {"version", "status", "error"}}`` (empty when none)."""
    try:
        return dict(json.loads(_setups_file(identity).read_text()).get("setups") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def store_setups(
    identity: Mapping[str, Any], outcomes: Mapping[str, tuple[str, str | None]]
) -> None:
    """Record TorchBench's setup outcomes (``{name: (status, last error line)}``, status ``OK``
    | ``FAIL`` | ``SKIP``) for the environment and checkout (:func:`setup_key`): a model whose
    setup FAILED here (its data or weights never downloaded, a requirement that did not
    install) is not available even when it imports. Kept until the model's source changes or
    a later install records its setup again, whatever is installed in between.

    Raises:
        OSError: the cache folder cannot be written.
    """
    setups = load_setups(identity)
    for name, (status, error) in outcomes.items():
        version = checkout.source_version(name)
        setups[name] = {"version": version, "status": status, "error": error}
    doc = {"identity": dict(identity), "setups": dict(sorted(setups.items()))}
    _replace(_setups_file(identity), doc)


def store(identity: Mapping[str, Any], checks: Iterable[ImportCheck]) -> None:
    """Add ``checks`` to the environment's cache (written whole, then renamed into place).

    Raises:
        OSError: the cache folder cannot be written.
    """
    kept = load(identity["id"])
    kept.update({c.name: c for c in checks})
    doc = {
        "identity": dict(identity),
        "models": {n: c.to_json() for n, c in sorted(kept.items())},
    }
    _replace(_cache_file(identity["id"]), doc)


def _replace(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON to ``path``: whole into a temporary file, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out, indent=1)
    os.replace(tmp, path)


def _read_reports(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """The probe's reports by model, and the model it started without reporting (if any)."""
    reports: dict[str, dict[str, Any]] = {}
    running = None
    for line in path.read_text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if item.get("event") == "start":
            running = item["name"]
        else:
            reports[item["name"]] = item
            running = None
    return reports, running


def _run_batch(
    names: Sequence[str], *, python: str, root: Path, devices: Sequence[str], timeout_s: int
) -> tuple[dict[str, dict[str, Any]], str | None, str | None]:
    """One probe process over ``names``: its reports, the model it was at when it timed out or
    died (None when it finished), and why it stopped (None when it finished)."""
    with tempfile.TemporaryDirectory(prefix="nightbench-probe-") as tmp:
        out, err = Path(tmp) / "reports.jsonl", Path(tmp) / "stderr"
        out.touch()
        command = [python, str(PROBE), "check", "--root", str(root), "--out", str(out)]
        command += ["--devices", ",".join(devices), "--timeout", str(timeout_s), *names]
        with open(err, "wb") as err_file:
            try:
                proc = subprocess.Popen(
                    command,
                    cwd=root,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,  # models print on import; reports go to --out
                    stderr=err_file,
                    start_new_session=True,
                )
            except OSError as exc:
                return {}, None, f"cannot run {python}: {exc.strerror or exc}"
            limit = STARTUP_S + timeout_s * len(names)
            try:
                code = proc.wait(timeout=limit)
                stopped = None if code == 0 else f"the check process exited with code {code}"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                stopped = f"timed out ({limit:.0f} s for {len(names)} model(s))"
        reports, running = _read_reports(out)
        if stopped and running is None and not reports:
            tail = err.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            stopped = f"{stopped}: {tail[0]}"
        return reports, running, stopped


def run_checks(
    names: Sequence[str],
    *,
    python: str | None = None,
    devices: Sequence[str] = ("cpu",),
    timeout_s: int = TIMEOUT_S,
    batch: int = BATCH,
) -> dict[str, ImportCheck]:
    """Check ``names`` (TorchBench's names) in the environment of ``python`` (default: this
    interpreter), ``batch`` models per process, each stopped after ``timeout_s`` seconds
    (SIGALRM in the probe) and the process killed after ``STARTUP_S`` more than its models'
    share. A model running when its process was killed or died is reported so; the rest of its
    batch is checked again in a new process.

    Raises:
        InvalidCheckout, TorchBenchUnavailable: no checkout (see
            :func:`suite.torchbench_checkout.checkout_root`).
    """
    root = checkout.checkout_root()
    python = python or sys.executable
    versions = {n: checkout.source_version(n) for n in names}
    out: dict[str, ImportCheck] = {}
    todo = list(names)
    while todo:
        chunk, todo = todo[:batch], todo[batch:]
        reports, running, stopped = _run_batch(
            chunk, python=python, root=root, devices=devices, timeout_s=timeout_s
        )
        for name, report in reports.items():
            out[name] = ImportCheck(
                name=name,
                version=versions[name],
                imported=bool(report.get("imported")),
                cause=report.get("needs") if report.get("imported") else cause(report),
                configs=dict(report.get("configs") or {}),
                seconds=report.get("seconds"),
            )
        failed = [running] if running else [n for n in chunk if n not in reports]
        for name in failed:
            why = stopped or "the check process ended without a report"
            out[name] = ImportCheck(
                name=name, version=versions[name], imported=False, cause=f"import check {why}"
            )
        todo = [n for n in chunk if n not in out] + todo
    return out


def checks(
    names: Sequence[str],
    *,
    python: str | None = None,
    devices: Sequence[str] = ("cpu",),
    run: bool = True,
    refresh: bool = False,
    timeout_s: int = TIMEOUT_S,
) -> tuple[dict[str, Any], dict[str, ImportCheck]]:
    """``(identity, {name: check})`` for ``names`` in the environment of ``python``: the cached
    checks still valid (same environment, same source version), and with ``run`` the others
    checked now and cached (all of them with ``refresh``). A model neither cached nor checked
    is left out.

    Raises:
        InvalidCheckout, TorchBenchUnavailable: no checkout.
        RuntimeError: ``python`` cannot be run.
        OSError: the cache cannot be written.
    """
    identity = environment_identity(python)
    cached = {} if refresh else load(identity["id"])
    valid = {
        n: cached[n]
        for n in names
        if n in cached and cached[n].version == checkout.source_version(n)
    }
    stale = [n for n in names if n not in valid]
    if run and stale:
        fresh = run_checks(stale, python=python, devices=devices, timeout_s=timeout_s)
        store(identity, fresh.values())
        valid.update(fresh)
    return identity, valid


def failed_setups(identity: Mapping[str, Any]) -> dict[str, str]:
    """``{name: why}`` for the models whose TorchBench setup FAILED in this environment and
    checkout, at their current source version (see :func:`store_setups`)."""
    out = {}
    for name, setup in load_setups(identity).items():
        try:
            current = checkout.source_version(name)
        except LookupError:
            continue
        if setup.get("status") == "FAIL" and setup.get("version") == current:
            out[name] = f"{SETUP_FAILED}: {setup.get('error')}"
    return out


def apply(entry: ModelInfo, check: ImportCheck | None) -> ModelInfo:
    """A listing entry as the import check has it: unavailable with the cause (or "not
    checked"); otherwise each checked (test, device) offered only when TorchBench's construction
    decided a batch size for it (that batch size listed), and never what the files already rule
    out (``entry.not_offered``, :func:`suite.torchbench_checkout.exclusions`: metadata, a method
    that always raises). An entry already unavailable for its files stays so."""
    if not entry.available:
        return entry
    if check is None:
        return replace(entry, available=False, checked=False, reason=NOT_CHECKED)
    if not check.imported or check.cause is not None:
        return replace(entry, available=False, reason=check.cause)
    sizes = {"train": dict(entry.train_batch_size), "eval": dict(entry.eval_batch_size)}
    why = dict(entry.not_offered)
    for key, outcome in check.configs.items():
        test, device = key.split(":")
        if "skipped" in outcome or key in entry.not_offered:
            continue
        if outcome.get("batch_size"):
            sizes[test][device] = int(outcome["batch_size"])
            why.pop(key, None)
        else:
            sizes[test].pop(device, None)
            why[key] = outcome.get("not_implemented") or f"construction: {outcome.get('error')}"
    checked = checkout.offered(
        replace(entry, train_batch_size=sizes["train"], eval_batch_size=sizes["eval"]), why
    )
    if not checked.modes:
        reasons = "; ".join(f"{k}: {v}" for k, v in checked.not_offered.items())
        return replace(checked, available=False, reason=f"{NO_TEST}: {reasons}")
    return checked
