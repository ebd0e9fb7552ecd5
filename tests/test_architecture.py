"""The dependency rule of docs/ARCHITECTURE.md, read from the imports of every source file.

Rooms stand on floors: a room may import only the rooms its entry in `ALLOWED` names (and itself).
Function-level imports count too (a lazy import is still an arrow), and the module graph must have
no circle. Only the Lightning-facing rooms import `lightning`. The package's top level holds a few floor modules and
the command line; everything else lives in a room named for its concept.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "ragen_lit"

# The floors, bottom up. `parallel.collectives`, `.lockstep` and `.fsdp` are torch.distributed only, so the
# floors below the Lightning strategies may use them.
BOTTOM = {
    "choices",
    "errors",
    "algos",
    "filtering",
    "logprobs",
    "kernels",
    "envs",
    "parallel.collectives",
    "figures",
    "shapes",
    "seeds",
}
PARALLEL = {
    "parallel",
    "parallel.collectives",
    "parallel.lockstep",
    "parallel.fsdp",
    "parallel.sharded",
    "parallel.strategy",
}
# everything `training/` stands on; the rooms above it add their own neighbours
BELOW_TRAINING = BOTTOM | PARALLEL | {"agent", "engines", "models", "presets", "metrics", "config", "run"}
ALLOWED: dict[str, set[str]] = {
    **{room: set() for room in BOTTOM},
    "algos": {"choices"},
    "filtering": {"choices"},
    "logprobs": {"kernels"},
    "models": {"choices", "errors", "logprobs", "kernels"},
    "engines": {"choices", "errors", "models", "kernels", "parallel.collectives", "shapes"},
    "agent": {"envs", "engines"},
    # the torch.distributed helpers of parallel/, not its Lightning strategies
    "metrics": {"choices", "errors", "logprobs", "kernels", "models", "algos", "filtering", "shapes", "seeds"}
    | {"parallel.collectives", "parallel.lockstep", "parallel.fsdp"},
    "config": {"choices", "errors", "envs"},
    "presets": {"errors", "config", "models", "engines", "envs", "agent"},
    "parallel.lockstep": {"parallel.collectives"},
    "parallel.fsdp": {"parallel.collectives", "logprobs", "models"},
    "parallel.sharded": {"parallel.fsdp", "parallel.collectives"},
    "parallel.strategy": {"parallel.collectives", "parallel.fsdp", "config"},
    "parallel": set(),
    # a run's life: its provenance, folder, record, loggers, checkpoints, locks and the checks before it starts
    # models, presets: the policy in a checkpoint is rebuilt on the base model the run started from, and the
    # preflight bounds read the model's shape; envs, engines: the preflight builds one env and names the vLLM extra
    "run": {"errors", "config", "models", "presets", "envs", "engines"},
    # __init__: the package's version, in the warm start's record
    "training": BELOW_TRAINING | {"__init__"},
    "diagnose": {
        "errors",
        "config",
        "metrics",
        "models",
        "presets",
        "run",
        "logprobs",
        "parallel.collectives",
    },
    # metrics: `compare --collapse` replays the collapse alarm on logged streams
    # run: a sweep runs fit's checks (preflight) on every planned run before any starts, locks the sweep folder and
    # leaves alone a run folder that a fit holds
    "analysis": {
        "errors",
        "figures",
        "config",
        "metrics",
        "run",
    },
    # training: the rollout loop as `fit` validates (`RolloutDataModule.run_rollouts`); analysis: the Wilson interval
    # and the role tag `compare` reads; run: the checks before a run (the host bound of episodes x samples among
    # them), the checkpoints, the store and the provenance
    "evaluation": {
        "errors",
        "config",
        "agent",
        "models",
        "presets",
        "run",
        "analysis",
        "training",
    },
    "cli": BELOW_TRAINING | {"training", "diagnose", "evaluation", "analysis", "run"},
    "__main__": {"cli"},
    "__init__": {"envs"},
}
LIGHTNING_ROOMS = {"training", "run", "parallel.strategy", "parallel.sharded", "cli"}
# The longest a source file may grow, in lines: a module does one job that a reader takes in at one sitting.
MAX_LINES = 450
# Named exceptions, each with its reason. The LightningModule wires the training functions together, so it stays
# shorter than the rest; its one piece of algorithm is the PPO/GRPO update of a mini-batch (`update`), which reads
# top to bottom in one place (totals, then per micro-batch: score, loss, backward, record; critic likewise;
# optimizer steps) rather than cut into callbacks across files, and its cap leaves room for that loop.
MAX_LINES_OF = {"training/module.py": 380}
# The most modules the package's top level may hold besides `__init__.py` and `__main__.py`: a newcomer reads the
# rooms' names, not a flat list of files.
MAX_TOP_LEVEL_MODULES = 8
# The most functions that may take a whole `Config`: the config's own checks, rendering and bundles (`Sections.of`),
# the command line's `fit`, the checks of a whole config on this machine, what records or describes a whole run. Every
# other function takes the sections it reads: one section, a `Sections` bundle of a few, or the opened `Run`.
MAX_WHOLE_CONFIG_FUNCTIONS = 19


def room_of(module: str) -> str:
    """`ragen_lit.algos.losses` → `algos`; every module of `parallel/` is a room of its own, since its
    torch.distributed helpers sit low and its Lightning strategies high."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "parallel" and len(parts) > 1:
        return f"parallel.{parts[1]}"
    return parts[0]


def module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at any depth of the file, relative imports resolved."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # `from a.b import c`: the submodule a.b.c when there is one, else a name of a.b
            # (`project_graph` resolves each to the longest module prefix that exists)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def project_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            if not imported.startswith("ragen_lit"):
                continue
            # an import of a name inside a module resolves to the longest module prefix we have
            while imported not in modules and "." in imported:
                imported = imported.rpartition(".")[0]
            if imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def test_every_room_is_known():
    rooms = {room_of(m) for m in project_graph()}
    assert rooms <= set(ALLOWED), f"rooms without a floor in ALLOWED: {sorted(rooms - set(ALLOWED))}"


def test_rooms_import_only_the_floors_below_them():
    violations = []
    for module, targets in sorted(project_graph().items()):
        room = room_of(module)
        for target in sorted(targets):
            target_room = room_of(target)
            if target_room != room and target_room not in ALLOWED[room]:
                violations.append(f"{module} -> {target}")
    assert not violations, "upward or sideways imports:\n" + "\n".join(violations)


def test_only_the_lightning_rooms_import_lightning():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = room_of(module_name(path))
        lightning = {m for m in imports_of(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}
        if lightning and room not in LIGHTNING_ROOMS:
            offenders.append(f"{module_name(path)} imports {sorted(lightning)}")
    assert not offenders, "\n".join(offenders)


def test_the_kernels_import_only_torch_and_triton():
    """`kernels/` is the floor under the model code: PyTorch, Triton and the standard library, nothing else."""
    offenders = []
    for path in sorted((PACKAGE / "kernels").rglob("*.py")):
        for module in imports_of(path):
            top = module.split(".")[0]
            if top not in ("torch", "triton", "ragen_lit") and top not in sys.stdlib_module_names:
                offenders.append(f"{module_name(path)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_the_package_never_imports_the_benchmarks():
    """`scripts/bench/` stands on the package, never the other way round (it is not installed with it)."""
    offenders = [
        f"{module_name(path)} imports {sorted(found)}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := {m for m in imports_of(path) if m.split(".")[0] == "bench"})
    ]
    assert not offenders, "\n".join(offenders)


def test_every_source_file_stays_short():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        limit = MAX_LINES_OF.get(name, MAX_LINES)
        lines = len(path.read_text().splitlines())
        if lines > limit:
            too_long.append(f"{name}: {lines} lines, at most {limit}")
    assert not too_long, "split by job:\n" + "\n".join(too_long)


def test_the_top_level_holds_few_modules():
    modules = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in ("__init__.py", "__main__.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(modules)} modules at the top level of ragen_lit, at most {MAX_TOP_LEVEL_MODULES}; move some into the "
        "room of their concept: " + ", ".join(modules)
    )


def test_the_top_level_rule_sees_one_module_too_many(tmp_path, monkeypatch):
    """The check above can fail: on a made-up package with one module more than it allows (a room's modules and
    `__init__.py`, `__main__.py` do not count)."""
    package = tmp_path / "ragen_lit"
    (package / "run").mkdir(parents=True)
    for name in ("__init__", "__main__", *(f"m{i}" for i in range(MAX_TOP_LEVEL_MODULES))):
        (package / f"{name}.py").write_text("")
    (package / "run" / "lock.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    test_the_top_level_holds_few_modules()
    (package / "one_more.py").write_text("")
    try:
        test_the_top_level_holds_few_modules()
    except AssertionError as error:
        assert f"{MAX_TOP_LEVEL_MODULES + 1} modules at the top level" in str(error) and "one_more.py" in str(error)
    else:
        raise AssertionError("the module past the limit was not reported")


def _names_config(annotation: ast.expr | None) -> bool:
    """`Config` or `Config | None`, written out or quoted: a whole config (a list of them is not one)."""
    if annotation is None:
        return False
    quoted = isinstance(annotation, ast.Constant) and isinstance(annotation.value, str)
    text = annotation.value if quoted else ast.unparse(annotation)
    return any(part.strip().rpartition(".")[2] == "Config" for part in text.split("|"))


def whole_config_functions() -> list[str]:
    """`module.function(parameter)` of every function with a parameter annotated `Config`, or named `cfg` and left
    unannotated (the package's name for a config: unannotated, it would slip past the count)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args
            for arg in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
                if _names_config(arg.annotation) or (arg.annotation is None and arg.arg == "cfg"):
                    found.append(f"{module_name(path)}.{node.name}({arg.arg})")
                    break
    return found


def test_few_functions_take_the_whole_config():
    found = whole_config_functions()
    assert len(found) <= MAX_WHOLE_CONFIG_FUNCTIONS, (
        f"{len(found)} functions take a whole Config, at most {MAX_WHOLE_CONFIG_FUNCTIONS}; give a room the sections "
        "it reads (one section, or a `config.Sections` bundle of a few):\n" + "\n".join(found)
    )


def test_the_whole_config_count_sees_each_way_of_taking_one(tmp_path, monkeypatch):
    """The count above sees a `Config` written out, quoted or optional and an unannotated `cfg`, and no section, bundle
    or list of configs."""
    package = tmp_path / "ragen_lit"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "m.py").write_text(
        "def a(cfg: Config, other: Config): ...\n"
        "def b(x, config: 'Config | None' = None): ...\n"
        "def c(cfg): ...\n"
        "def d(model: ModelConfig, cfg: ModuleSections, configs: list[Config], run: config.Run): ...\n"
        "class E:\n"
        "    def f(self, *, cfg: config.Config): ...\n"
    )
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    assert whole_config_functions() == [
        "ragen_lit.m.a(cfg)",
        "ragen_lit.m.b(config)",
        "ragen_lit.m.c(cfg)",
        "ragen_lit.m.f(cfg)",
    ]


def test_the_module_graph_has_no_circle():
    graph = project_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (circle := visit(target)):
                return circle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            raise AssertionError("import circle: " + " -> ".join(circle))


def test_the_rule_reader_sees_a_circle_and_an_upward_import(tmp_path, monkeypatch):
    """The checks above can fail: on a made-up package with a circle and an algos -> training arrow."""
    package = tmp_path / "ragen_lit"
    (package / "algos").mkdir(parents=True)
    (package / "training").mkdir()
    (package / "__init__.py").write_text("")
    (package / "algos" / "__init__.py").write_text("from ragen_lit.training import loop\n")
    (package / "training" / "__init__.py").write_text("")
    (package / "training" / "loop.py").write_text("def f():\n    from ragen_lit.algos import x\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    graph = project_graph()
    assert graph["ragen_lit.algos"] == {"ragen_lit.training.loop"}
    assert graph["ragen_lit.training.loop"] == {"ragen_lit.algos"}
    try:
        test_rooms_import_only_the_floors_below_them()
    except AssertionError as error:
        assert "ragen_lit.algos -> ragen_lit.training.loop" in str(error)
    else:
        raise AssertionError("the upward import was not reported")
    try:
        test_the_module_graph_has_no_circle()
    except AssertionError as error:
        assert "import circle" in str(error)
    else:
        raise AssertionError("the circle was not reported")
