"""The wheel and the sdist, built from a clean checkout and installed as users install them.

What this covers, in fresh virtual environments:

- ``python -m build`` on a copy of the tracked files (no .venv, no build
  leftovers) makes an sdist, and a wheel from that sdist; their contents and
  metadata (version, extras, classifiers, the license and its text,
  ``py.typed``, the ``cmq`` script) are checked;
- the wheel, built by the README's command (``CMQ_REQUIRE_COMPILED=1
  python -m build``), is a binary wheel for this platform carrying the
  compiled core (``cmq._speedups``), and ``cmq.implementation()`` is
  ``"compiled"`` where it is installed (where this machine has no C
  compiler, the test says so and skips that check); the same command where
  no compiler works fails, saying why, and makes no wheel;
- the sdist installed where no compiler works (``CC=/bin/false``) falls back
  to the pure-Python core, saying so once in the install's output, and
  ``cmq.implementation()`` is ``"python"`` there;
- the wheel and the sdist, each installed with no extra: ``cmq --help``,
  ``cmq --version``, every command's and verb's ``--help``, each command that
  needs an extra failing with the one line naming it, every module of the
  package importing or raising ``cmq.MissingExtra`` with that line, and
  messages pushed through ``cmq send`` into ``cmq recv`` over loopback;
- the wheel with each extra added in turn (``broker``, ``service``,
  ``bench``, then ``lab``): after each, what it brings works (the AMQP
  listener starts, ``cmq serve`` answers ``/health``, the ZeroMQ peer is
  available; ``cmq lab --help`` lists the experiments, a tiny ``cmq lab``
  run writes its Parquet records, ``cmq report`` aggregates them on Spark
  and draws the page's figures with matplotlib, and no peer of the lab asks
  for an extra) and what the next one brings still fails in one line; with
  all four in, every module of the package imports and ``pip check`` finds
  every requirement met.

The build backend and every dependency of the core and the extras are put
once into a wheelhouse; every build and install after that is
``--no-index`` from it. The light extras' wheels are downloaded (from pip's
cache when it is warm). PySpark is published only as an sdist (a 450 MB
wheel once built), so the lab extra's requirements go through ``pip
wheel``, which takes pyspark's wheel from pip's wheel cache, where
``./bootstrap.sh`` left it when it installed the lab extra (on a machine
whose cache lacks it, pip builds it: a minute or two more, once). Installing
the lab extra is the longest step of this file (about 20 s).
"""

from __future__ import annotations

import contextlib
import email
import importlib.metadata
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import threading
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .cases import EXTRAS, IMPORT_EVERY_MODULE, help_argvs, needs_extra_argvs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
VERSION = PROJECT["version"]
PIP = [sys.executable, "-m", "pip"]
#: Extras installed from their wheels' downloads (see the module docstring);
#: then ``lab``, whose PySpark comes from pip's wheel cache.
LIGHT_EXTRAS = ("broker", "service", "bench")
#: What setup.py says, once, when it cannot build the compiled core.
FALLBACK_NOTE = "cmq: the compiled core was not built"
#: Set, a build fails where it cannot compile the core (setup.py).
REQUIRE_COMPILED = "CMQ_REQUIRE_COMPILED"
#: Whether this machine can compile the extension at all.
HAVE_CC = shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]) is not None
#: A module of each extra's that cmq imports at module level, with the import
#: that reaches it.
OPTIONAL_IMPORTS = {
    "service": "cmq.service.server",
    "lab": "cmq.lab.records",
}


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path
    wheelhouse: Path
    tmp: Path
    checkout: Path

    def add_lab(self) -> None:
        """Put the lab extra's requirements, and theirs, into the wheelhouse."""
        requirements = [r for r in PROJECT["optional-dependencies"]["lab"] if _name(r) != "pycmq"]
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            # The pyspark this environment has: pip's cache holds its wheel
            # (a newer release would be a 450 MB download and a build).
            requirements.append(f"pyspark=={importlib.metadata.version('pyspark')}")
        _run([*PIP, "wheel", "-q", "-w", self.wheelhouse, "--find-links", self.wheelhouse,
              *requirements], timeout=600)  # fmt: skip


def _run(cmd: list[str | Path], *, timeout: float = 300, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc  # type: ignore[no-any-return]


def _offline_env(wheelhouse: Path) -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "CMQ_PURE_PYTHON")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    # No cache: everything comes from the wheelhouse, and the wheels pip
    # builds here (the sdist's pure-Python fallback among them) stay out of
    # the user's pip cache.
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")  # fmt: skip
    return env


def _clean_checkout(dest: Path) -> None:
    """Copy the tracked files as they are in the working tree (nothing untracked, no .venv)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False
    )
    if listed.returncode != 0:
        pytest.skip("needs a git checkout of the project")
    for name in listed.stdout.decode().split("\0"):
        src = ROOT / name
        if name and src.is_file():  # a tracked file deleted in the working tree is left out
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dists]:
    tmp = tmp_path_factory.mktemp("dist")
    checkout, out, wheelhouse = tmp / "checkout", tmp / "dist", tmp / "wheelhouse"
    _clean_checkout(checkout)
    # One trip to the index: the build backend, the core's and the light
    # extras' dependencies.
    extras = PROJECT["optional-dependencies"]
    needed = [*PYPROJECT["build-system"]["requires"], *PROJECT["dependencies"],
              *(r for e in LIGHT_EXTRAS for r in extras[e] if _name(r) != "pycmq")]  # fmt: skip
    _run([*PIP, "download", "-q", "--only-binary", ":all:", "-d", wheelhouse, *needed])
    # The sdist, then the wheel built from it (as pip builds on a user's
    # machine), by the README's command: with CMQ_REQUIRE_COMPILED, a wheel
    # without the compiled core fails to build rather than being made.
    env = {**_offline_env(wheelhouse), **({REQUIRE_COMPILED: "1"} if HAVE_CC else {})}
    _run([sys.executable, "-m", "build", "--outdir", out, checkout], env=env)
    (wheel,) = out.glob("pycmq-*.whl")
    (sdist,) = out.glob("pycmq-*.tar.gz")
    sizes = {p.name: p.stat().st_size for p in (wheel, sdist)}
    print(f"built {json.dumps(sizes)}")  # shown with -s: the sizes of the distributions
    yield Dists(wheel=wheel, sdist=sdist, wheelhouse=wheelhouse, tmp=tmp, checkout=checkout)
    # The wheelhouse holds pyspark's 450 MB wheel once the lab's test has
    # run: pytest keeps the last few runs' directories, not this.
    shutil.rmtree(wheelhouse, ignore_errors=True)


class Venv:
    """A fresh virtual environment (no pip of its own: the test's pip installs into it)."""

    def __init__(self, path: Path, wheelhouse: Path) -> None:
        _run([sys.executable, "-m", "venv", "--without-pip", path])
        self.path, self.wheelhouse = path, wheelhouse
        self.python = path / "bin" / "python"
        self.env = _offline_env(wheelhouse)
        self.env["PATH"] = f"{path / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"

    def install(
        self, *requirements: str | Path, env: dict[str, str] | None = None, compile: bool = True
    ) -> str:
        """Install; returns pip's verbose output (the build's, for an sdist).

        ``compile=False`` leaves the installed modules' bytecode to be
        written when they are first imported, as Python does anyway.
        """
        cmd = [*PIP, "--python", self.python, "install", "-v", *requirements]
        if not compile:
            cmd.append("--no-compile")
        done = _run(cmd, env={**self.env, **(env or {})})
        return done.stdout + done.stderr

    def cmq(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.path / "bin" / "cmq"), *args], capture_output=True,
                              text=True, timeout=timeout, env=self.env, cwd=self.path,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.path / "bin" / "cmq"), *args], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env, cwd=self.path)  # fmt: skip

    def python_code(self, code: str, *args: str) -> str:
        return _run([self.python, "-c", code, *args], env=self.env, cwd=self.path).stdout

    def import_every_module(self) -> dict[str, list[str]]:
        """What importing each module of the installed cmq did (see cases.IMPORT_EVERY_MODULE)."""
        found: dict[str, list[str]] = json.loads(self.python_code(IMPORT_EVERY_MODULE, "[]"))
        return found


def _lines(stream: object) -> queue.Queue[str]:
    """The lines of a child's pipe, as a reader thread gets them ("" at its end)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _wait_for_line(lines: queue.Queue[str], pattern: str, timeout: float = 60) -> re.Match[str]:
    seen: list[str] = []
    while True:
        line = lines.get(timeout=timeout)
        match = re.search(pattern, line)
        if match:
            return match
        seen.append(line)
        assert line, f"ended without a line matching {pattern!r}: {seen}"


@pytest.fixture
def stop() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


# -- what was built ----------------------------------------------------------------


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement, maxsplit=1)[0].lower()


def _expanded(by_extra: dict[str, list[str]]) -> dict[str, set[str]]:
    """Distribution names per extra, ``pycmq[a,b]`` replaced by what a and b bring.

    Backends differ in whether they write a self-reference or its expansion
    into the metadata; pip installs the same either way.
    """

    def names(extra: str) -> set[str]:
        found: set[str] = set()
        for req in by_extra.get(extra, []):
            if _name(req) == "pycmq":
                for inner in re.findall(r"[\w-]+", req.partition("[")[2].partition("]")[0]):
                    found |= names(inner)
            else:
                found.add(_name(req))
        return found

    return {extra: names(extra) for extra in by_extra}


def _requires(meta: email.message.Message) -> dict[str, set[str]]:
    by_extra: dict[str, list[str]] = {}
    for req in meta.get_all("Requires-Dist") or []:
        extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", req)
        by_extra.setdefault(extra.group(1) if extra else "", []).append(req)
    return _expanded(by_extra)


def _declared() -> dict[str, set[str]]:
    return _expanded({"": PROJECT["dependencies"], **PROJECT["optional-dependencies"]})


def _package_files() -> set[str]:
    """Every file of the package the repository tracks (modules, py.typed, templates, ...)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "src/cmq"],
                            capture_output=True, check=True).stdout.decode()  # fmt: skip
    return {name.removeprefix("src/") for name in listed.split("\0") if name}


def test_the_wheel_holds_the_package_and_its_metadata(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as zf:
        names = set(zf.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(zf.read(info))
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
        license_text = zf.read(info.replace("METADATA", "licenses/LICENSE"))
    assert _package_files() <= names  # every module and py.typed
    assert not any(n.startswith(("tests/", "src/")) or n.endswith(".c") for n in names)
    assert (meta["Name"], meta["Version"]) == ("pycmq", VERSION)
    assert meta["Requires-Python"] == PROJECT["requires-python"]
    # The license: its SPDX expression, and its text in the .dist-info.
    assert meta["License-Expression"] == PROJECT["license"]
    assert meta.get_all("License-File") == PROJECT["license-files"] == ["LICENSE"]
    assert license_text == (ROOT / "LICENSE").read_bytes()
    assert set(meta.get_all("Classifier") or []) == set(PROJECT["classifiers"])
    urls = PROJECT.get("urls", {})
    assert set(meta.get_all("Project-URL") or []) == {f"{k}, {v}" for k, v in urls.items()}
    assert set(meta.get_all("Provides-Extra") or []) == set(PROJECT["optional-dependencies"])
    # What pip will install for each extra is what pyproject.toml declares.
    assert _requires(meta) == _declared()
    assert re.search(r"^cmq\s*=\s*cmq\.cli:main$", entry_points, re.MULTILINE)


def test_the_sdist_holds_the_sources(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tf:
        top = f"pycmq-{VERSION}/"
        names = {n.removeprefix(top) for n in tf.getnames()}
        pkg_info = tf.extractfile(top + "PKG-INFO")
        assert pkg_info is not None
        meta = email.message_from_bytes(pkg_info.read())
    assert {"pyproject.toml", "setup.py", "README.md", "CHANGELOG.md", "LICENSE"} <= names
    assert meta["License-Expression"] == PROJECT["license"]
    assert "src/cmq/_speedups.pyx" in names
    assert {f"src/{n}" for n in _package_files()} <= names
    assert meta["Version"] == VERSION


# -- installed with no extra -------------------------------------------------------


def test_the_wheel_is_binary_and_carries_the_compiled_core(dists: Dists) -> None:
    if not HAVE_CC:
        pytest.skip("no C compiler on this machine: the wheel was built with the pure-Python core")
    tag = dists.wheel.name.removesuffix(".whl").split("-")[-3:]
    assert tag[:2] == [f"cp{sys.version_info.major}{sys.version_info.minor}"] * 2, tag
    assert tag[2] != "any", tag
    with zipfile.ZipFile(dists.wheel) as zf:
        assert [n for n in zf.namelist() if re.fullmatch(r"cmq/_speedups\..*\.so", n)]


def test_the_binary_wheel_command_fails_where_it_cannot_compile(dists: Dists) -> None:
    env = {**_offline_env(dists.wheelhouse), REQUIRE_COMPILED: "1", "CC": "/bin/false"}
    out = dists.tmp / "no-wheel"
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(dists.checkout)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert "cmq: the compiled core was not built" in said and "CMQ_REQUIRE_COMPILED is set" in said
    assert not list(out.glob("*.whl"))


@dataclass(frozen=True)
class Installed:
    venv: Venv
    kind: str
    log: str
    """pip's verbose output of the install."""


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(request: pytest.FixtureRequest, dists: Dists) -> Installed:
    kind = request.param
    venv = Venv(dists.tmp / f"venv-{kind}", dists.wheelhouse)
    # The sdist goes where no compiler works: it must fall back, not fail.
    log = venv.install(getattr(dists, kind), env={"CC": "/bin/false"} if kind == "sdist" else None)
    return Installed(venv, kind, log)


@pytest.fixture
def bare(installed: Installed) -> Venv:
    return installed.venv


def test_which_core_runs(installed: Installed) -> None:
    core = installed.venv.python_code("import cmq; print(cmq.implementation())").strip()
    version = installed.venv.cmq("--version").stdout
    if installed.kind == "wheel":
        assert core == ("compiled" if HAVE_CC else "python")
        if HAVE_CC:
            assert version == f"cmq {VERSION} (compiled core)\n"
        assert FALLBACK_NOTE not in installed.log
    else:
        assert core == "python"
        # Said once by the build (pip shows it with -v), with how to get the
        # compiled core; and by cmq --version after.
        assert installed.log.count(FALLBACK_NOTE) == 1, installed.log
        note = next(line for line in installed.log.splitlines() if FALLBACK_NOTE in line)
        assert "pure-Python core" in note and "C compiler" in note, note
        assert "--no-cache-dir" in note, note
        assert version == (
            f"cmq {VERSION} (pure-Python core: "
            "the compiled core was not built when cmq was installed)\n"
        )


def test_every_help_works_without_extras(bare: Venv) -> None:
    top = bare.cmq("--help")
    assert top.returncode == 0 and "commands:" in top.stdout
    for argv in help_argvs():
        r = bare.cmq(*argv)
        assert (r.returncode, r.stderr) == (0, ""), (argv, r.stderr)
        assert r.stdout.strip(), argv


def test_a_command_needing_an_extra_says_which_in_one_line(bare: Venv, tmp_path: Path) -> None:
    for argv, extra in needs_extra_argvs(tmp_path):
        r = bare.cmq(*argv)
        assert r.returncode == 1, (argv, r.stdout, r.stderr)
        assert len(r.stderr.splitlines()) == 1, (argv, r.stderr)  # no traceback
        assert f"needs the {extra!r} extra" in r.stderr, (argv, r.stderr)
        assert f"pip install 'pycmq[{extra}]'" in r.stderr, (argv, r.stderr)


def test_importing_an_optional_part_raises_missing_extra(bare: Venv) -> None:
    for extra, module in OPTIONAL_IMPORTS.items():
        out = bare.python_code(
            "import importlib, cmq\n"
            f"try:\n    importlib.import_module({module!r})\n"
            "except cmq.MissingExtra as exc:\n    print(exc.extra, exc)\n"
        )
        assert out.startswith(f"{extra} ") and f"pip install 'pycmq[{extra}]'" in out, out
    # Every module of the package imports, or names its extra in one line;
    # here, with the extras really absent (not only blocked, as in
    # test_extras.py), a module of another distribution that cmq imports
    # without listing it would show up too.
    found = bare.import_every_module()
    assert found["bad"] == [] and found["missing"], found


def test_push_and_get_over_loopback(bare: Venv, stop: list[subprocess.Popen[str]]) -> None:
    recv = bare.popen("recv", "--port", "0", "--host", "127.0.0.1", "--count", "3")
    stop.append(recv)
    assert recv.stderr is not None
    port = _wait_for_line(_lines(recv.stderr), r"receiving on 127\.0\.0\.1:(\d+)").group(1)
    send = subprocess.run([str(bare.path / "bin" / "cmq"), "send", f"127.0.0.1:{port}"],
                          input="one\ntwo\nthree\n", capture_output=True, text=True,
                          timeout=60, env=bare.env)  # fmt: skip
    assert send.returncode == 0, send.stderr
    out, _ = recv.communicate(timeout=60)
    assert (recv.returncode, out) == (0, "one\ntwo\nthree\n")


# -- the extras, one at a time ----------------------------------------------------


def test_each_extra_brings_what_it_says(
    dists: Dists, tmp_path: Path, stop: list[subprocess.Popen[str]]
) -> None:
    assert set(LIGHT_EXTRAS) | {"lab"} == set(EXTRAS)
    venv = Venv(tmp_path / "venv", dists.wheelhouse)
    venv.install(dists.wheel)

    venv.install(f"{dists.wheel}[broker]")
    broker = venv.popen("broker", "--port", "0", "--amqp-port", "0", "--in-memory")
    stop.append(broker)
    assert broker.stdout is not None
    _wait_for_line(_lines(broker.stdout), r"AMQP 0-9-1 on 127\.0\.0\.1:\d+")
    broker.terminate()
    assert broker.wait(30) == 0
    still = venv.cmq("serve", "--port", "0", "--store", "memory:")
    assert still.returncode == 1 and "pip install 'pycmq[service]'" in still.stderr

    venv.install(f"{dists.wheel}[service]")
    serve = venv.popen("serve", "--port", "0", "--store", "memory:")
    stop.append(serve)
    assert serve.stdout is not None
    url = _wait_for_line(_lines(serve.stdout), r"listening on (http://\S+)").group(1)
    with urllib.request.urlopen(f"{url}/health", timeout=30) as response:
        assert response.status == 200
    serve.terminate()
    assert serve.wait(30) == 0
    zmq = "from cmq.lab.systems import load; print(load('zmq').available())"
    assert "pip install 'pycmq[bench]'" in venv.python_code(zmq)

    venv.install(f"{dists.wheel}[bench]")
    assert venv.python_code(zmq) == "None\n"
    lab = venv.cmq("report", str(tmp_path))
    assert lab.returncode == 1 and "pip install 'pycmq[lab]'" in lab.stderr

    # The lab. Compiling the bytecode of pyspark's thousands of modules was
    # a quarter of this install's time (29 s against 22): it is written on
    # first import instead.
    dists.add_lab()
    venv.install(f"{dists.wheel}[lab]", compile=False)
    _run([*PIP, "--python", venv.python, "check"], env=venv.env)
    listed = venv.cmq("lab", "--help")
    assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr
    assert "cmq-fig5 [fig5]" in listed.stdout and "pip install" not in listed.stdout
    out = tmp_path / "lab"
    lab = venv.cmq("lab", "--profile", "tiny", "--only", "fig5", "--systems", "cmq",
                   "--sizes", "64", "--count", "20", "--out", str(out), "--no-report",
                   "--quiet", timeout=120)  # fmt: skip
    assert lab.returncode == 0, lab.stdout + lab.stderr
    assert "runs: 1 ok" in lab.stdout and list((out / "records").glob("*.parquet")), lab.stdout
    report = venv.cmq("report", str(out), timeout=180)
    assert report.returncode == 0, report.stdout + report.stderr
    assert report.stdout == f"{out / 'report.html'}\n"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="cmq-fig5">' in page and "<svg" in page  # matplotlib's figure
    peers = "from cmq.lab.systems import *\nfor s in SYSTEMS: print(load(s).available())"
    # A peer's server may be missing here; its Python client may not.
    assert "pip install 'pycmq[" not in venv.python_code(peers)
    # With every extra in, every module of the package imports.
    assert venv.import_every_module() == {"bad": [], "missing": []}
    shutil.rmtree(venv.path)  # 1.3 GB; kept only when the test fails
