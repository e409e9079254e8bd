"""The experiment registry: every module has the same shape, profiles and names resolve."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import cmq.lab.experiments as lab_experiments
from cmq import ConfigError
from cmq.lab.experiments import (
    PROFILES,
    Context,
    LabExperiment,
    Profile,
    get,
    page,
    register,
    resolve,
)
from cmq.lab.systems import SYSTEMS

# Every experiment: a module of the package, or a folder's ``experiment`` module.
MODULES = sorted(
    f"{m.name}.experiment" if (Path(lab_experiments.__path__[0]) / m.name / "experiment.py").exists()
    else m.name
    for m in pkgutil.iter_modules(lab_experiments.__path__)
    if not m.name.startswith("_")
)


def test_the_issue_experiments_are_all_there_in_order() -> None:
    ids = [e.id for e in lab_experiments.experiments()]
    ours = ["cmq-fig5", "cmq-fig6", "tuning", "scalability", "zmq-throughput"]
    assert [i for i in ids if i in ours] == ours


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_the_same_shape(name: str) -> None:
    module = importlib.import_module(f"cmq.lab.experiments.{name}")
    # One experiment per module, or a module of several (a tuple).
    name_ = "EXPERIMENT" if hasattr(module, "EXPERIMENT") else "EXPERIMENTS"
    assert name_ in module.__all__ and module.__doc__
    found = [module.EXPERIMENT] if name_ == "EXPERIMENT" else list(module.EXPERIMENTS)
    assert found
    for exp in found:
        _check_shape(exp)


def _check_shape(exp: LabExperiment) -> None:
    assert isinstance(exp, LabExperiment) and exp.title
    # Registered with the lab under its id, and with the report (its claims
    # and figures) under the same id.
    assert get(exp.id) is exp
    assert page(exp.id) is not None, f"{exp.id} has no report section"
    # The three functions answer for every profile without running anything.
    for profile in PROFILES.values():
        ctx = Context(out=Path("/nonexistent"), profile=profile,
                      systems=profile.systems)  # fmt: skip
        assert exp.steps(ctx) >= 1
        why = exp.unavailable(ctx)
        assert why is None or (isinstance(why, str) and why)


def test_names_and_aliases_resolve_in_run_order() -> None:
    assert [e.id for e in resolve(["zmq", "fig5"])] == ["cmq-fig5", "zmq-throughput"]
    assert [e.id for e in resolve(["cmq-fig6", "loss"])] == ["cmq-fig6"]
    assert len(resolve([])) == len(lab_experiments.experiments())
    with pytest.raises(ConfigError, match=r"unknown experiment 'fig7'.*cmq-fig5 \(fig5\)"):
        resolve(["fig7"])


def test_register_refuses_a_taken_name() -> None:
    fig5 = get("fig5")
    with pytest.raises(ConfigError, match="taken"):
        register(LabExperiment(id="other", title="x", aliases=("fig5",), run=fig5.run,
                               steps=fig5.steps))  # fmt: skip
    with pytest.raises(ConfigError, match="registered already"):
        register(LabExperiment(id="cmq-fig5", title="x", run=fig5.run, steps=fig5.steps))
    with pytest.raises(ConfigError, match="lower-case"):
        LabExperiment(id="Fig 5", title="x", run=fig5.run, steps=fig5.steps)


def test_profiles() -> None:
    full, quick = PROFILES["full"], PROFILES["quick"]
    # The papers' scale: 1000 messages at each of the 8 sizes, 64 B..64 KB x 0.1..200 ms.
    assert full.rt_count == 1000 and full.rt_sizes == (4, 16, 64, 256, 512, 1024, 4096, 16384)
    assert (min(full.tuning_qthresh), max(full.tuning_qthresh)) == (64, 65536)
    assert (min(full.tuning_timeouts), max(full.tuning_timeouts)) == (0.0001, 0.2)
    assert max(full.destinations) == 1_000_000 and full.rss_seconds >= 60
    assert (min(full.tp_sizes), max(full.tp_sizes)) == (1, 16384)
    assert full.systems == SYSTEMS
    # Quick keeps the cells the claims are judged on.
    assert 512 in quick.rt_sizes and 512 in quick.loss_sizes
    assert 512 in quick.tuning_qthresh and 0.2 in quick.tuning_timeouts
    assert quick.rss_seconds < full.rss_seconds


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"rt_sizes": ()}, "rt_sizes must not be empty"),
        ({"tp_sizes": (0,)}, "bad size 0"),
        ({"rt_count": 0}, "rt_count"),
        ({"systems": ("cmq", "kafka")}, "unknown system kafka"),
        ({"tuning_timeouts": (0.0,)}, "positive"),
        ({"rss_interval": 5.0, "rss_seconds": 1.0}, "interval"),
    ],
)
def test_profile_validation(change: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Profile(name="bad", **change)  # type: ignore[arg-type]


def test_context_validation() -> None:
    with pytest.raises(ConfigError, match="probability"):
        Context(out=Path("."), profile=PROFILES["tiny"], systems=("cmq",), loss=1.0)


def _imports(path: Path) -> set[str]:
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


SRC = Path(lab_experiments.__file__).parents[2]
# The stock-exchange simulation runs its processes on the AMQP suite's
# worker harness and cites the same paper: its one import of another experiment.
SHARED = {("stockex", "amqp")}


def test_the_pipeline_imports_nothing_from_the_lab() -> None:
    for path in (SRC / "pipeline").rglob("*.py"):
        lab = [m for m in _imports(path) if m == "cmq.lab" or m.startswith("cmq.lab.")]
        assert not lab, f"{path.name} imports {lab}"


def test_only_the_registry_imports_an_experiment_by_name() -> None:
    names = {e.split(".")[0] for e in MODULES}
    for path in SRC.rglob("*.py"):
        if path == SRC / "lab" / "experiments" / "__init__.py":
            continue
        rel = path.relative_to(SRC / "lab" / "experiments").parts if "experiments" in path.parts else ()
        home = rel[0].removesuffix(".py") if rel else None
        for module in _imports(path):
            parts = module.split(".")
            if parts[:3] != ["cmq", "lab", "experiments"] or len(parts) < 4:
                continue
            name = parts[3]
            if name in names and name != home and (home, name) not in SHARED:
                raise AssertionError(f"{path.relative_to(SRC)} imports experiment {name!r}")


def test_benchmarks_and_test_servers_live_in_the_lab_not_in_library_packages() -> None:
    for package in ("service", "routing", "pipeline", "net", "patterns"):
        found = [p.name for p in (SRC / package).rglob("*.py") if "bench" in p.name or p.name == "redis_local.py"]
        assert not found, f"cmq.{package} holds {found}"
    assert (SRC / "lab" / "bench" / "sqs.py").exists()
