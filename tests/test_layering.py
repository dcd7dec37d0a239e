"""Imports point one way: down. Each module of minialign may import only modules of a LOWER
level in LEVELS, so no import circle can form (the replicate <-> report circle of #10 would
fail here), and the core never reaches up into the machinery that runs it.

The core (minialign/*.py) stands on its own: two of its modules import from machinery/, and
only these (CORE_MACHINERY): model imports machinery.fast, the fast layer set, in the one place
that picks a layer set (it imports only layers and the fast path below it); train imports
machinery.rundir, machinery.checkpoint, machinery.files and machinery.monitor (training reads
its captions, writes a run directory, evaluates and prints its progress; they import only
numpy, tqdm and the core below train).

Parsed, not executed: every `import minialign.x`, `from minialign.x import y`, `from . import
x`, `from .x import y` and `from ..x import y` anywhere in a file, function bodies included.
"""
import ast
from pathlib import Path

import minialign

PKG = Path(minialign.__file__).parent
LEVELS = {  # module: level; a module imports only modules of a lower level
    "minialign": 0, "tokenizer": 0, "layers": 1, "losses": 0, "optim": 0, "metrics": 0,
    "machinery": 0, "machinery.files": 0, "machinery.flags": 0, "machinery.rows": 0,
    "machinery.blasenv": 0, "machinery.dirlock": 1,
    "data": 2, "machinery.machine": 2, "machinery.fast_rows": 2, "machinery.fast_layers": 3,
    "machinery.fast": 4,
    "machinery.rundir": 2,
    "machinery.embeddings": 2, "machinery.figures": 2, "machinery.slurm": 2,
    "machinery.speed": 0, "machinery.exercises": 0, "machinery.grade": 1, "machinery.jobs": 4, "machinery.scaling": 6,
    "model": 5, "machinery.gemms": 4, "machinery.checkpoint": 4, "machinery.download": 4,
    "machinery.photos": 6, "machinery.synthetic_v2": 0,
    "objectives": 6,
    "machinery.monitor": 8, "machinery.caption_stats": 9,
    "train": 10,
    "machinery.encoder": 12, "machinery.protocol": 12, "machinery.evaluate": 12,
    "machinery.synthetic": 12, "machinery.coco": 12, "machinery.export": 12, "machinery.bench": 12,
    "machinery.baselines": 13,
    "machinery.report": 14, "machinery.compare": 15, "machinery.bench_torch": 14, "machinery.estimate": 14,
    "machinery.replicate": 16, "machinery.scaling_report": 15, "machinery.slurm_runs": 17,
    "machinery.scaling_run": 17,
    "machinery.cli": 18,
    "__main__": 20,
}
# imports inside a function, each for a reason other than dodging a circle
LAZY_IMPORTS = {
    ("machinery.export", "torch"), ("machinery.export", "transformers"),  # optional extra
    ("machinery.coco", "machinery.download"),   # only `data` needs the network code
    ("machinery.coco", "machinery.photos"),
    ("machinery.grade", "pytest"),              # the [test] extra: only grading needs it
}
CORE = ("minialign", "tokenizer", "data", "layers", "model", "losses", "optim", "metrics",
        "objectives", "train", "__main__")
CORE_MACHINERY = {"model": {"machinery.fast"},
                  "train": {"machinery.rundir", "machinery.checkpoint", "machinery.files",
                            "machinery.monitor"}}
IMAGE_SIDE = {"machinery.embeddings", "machinery.evaluate", "machinery.export",
              "machinery.coco", "machinery.download", "machinery.photos"}


def module_name(path):
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "minialign"


def package_of(module):
    """The package a module's relative imports start from, as a list of names."""
    if module == "minialign" or "." not in module and module != "machinery":
        return ["minialign"]
    return ["minialign", "machinery"]


def known(name):
    """A dotted minialign name -> its module in LEVELS (a name inside a module -> the module)."""
    inner = ".".join(name.split(".")[1:]) or "minialign"
    while inner not in LEVELS and "." in inner:
        inner = inner.rsplit(".", 1)[0]
    return inner if inner in LEVELS else None


def resolve(module, node):
    """The minialign modules (LEVELS' names) and other top-level packages an import names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level == 0:
            head = node.module
        else:
            base = package_of(module)[:len(package_of(module)) - node.level + 1]
            head = ".".join(base + ([node.module] if node.module else []))
        # `from pkg import mod` imports mod; `from mod import name` imports mod
        subs = [f"{head}.{alias.name}" for alias in node.names]
        names = [n for n in subs if known(n) == ".".join(n.split(".")[1:])] or [head]
    ours, others = set(), set()
    for name in names:
        if name.split(".")[0] != "minialign":
            others.add(name.split(".")[0])
        elif known(name) not in (None, module):
            ours.add(known(name))
    return ours, others


def import_graph():
    """{module: ({minialign modules}, {other packages}, {names imported inside functions})}."""
    graph = {}
    for path in sorted(PKG.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text())
        ours, others, lazy = set(), set(), set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        lazy |= set.union(*resolve(module, inner))
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                o, t = resolve(module, node)
                ours |= o
                others |= t
        graph[module] = (ours, others, lazy)
    return graph


def test_every_module_has_a_level():
    assert set(import_graph()) == set(LEVELS)


def test_imports_point_down():
    wrong = [f"{m} (level {LEVELS[m]}) imports {d} (level {LEVELS[d]})"
             for m, (ours, _, _) in import_graph().items() for d in sorted(ours)
             if LEVELS[d] >= LEVELS[m]]
    assert not wrong, "\n".join(wrong)


def test_no_import_circle():
    graph = {m: ours for m, (ours, _, _) in import_graph().items()}

    def reaches(start, target, seen):
        return any(d == target or (d not in seen and not seen.add(d) and reaches(d, target, seen))
                   for d in graph[start])
    circles = sorted(m for m in graph if reaches(m, m, set()))
    assert not circles, f"modules on an import circle: {circles}"


def test_no_imports_inside_functions_but_the_listed_ones():
    found = {(m, name) for m, (_, _, lazy) in import_graph().items() for name in lazy}
    assert found <= LAZY_IMPORTS, sorted(found - LAZY_IMPORTS)


def test_training_never_imports_the_image_side():
    graph = import_graph()
    seen, todo = set(), ["minialign", "train"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(graph[module][0])
    assert {"data", "model", "objectives", "machinery.rundir"} <= seen   # the walk follows imports
    assert not seen & IMAGE_SIDE, f"train reaches {sorted(seen & IMAGE_SIDE)}"
    assert not set.union(*(graph[m][1] for m in seen)) & {"torch", "transformers", "PIL"}


def test_the_core_imports_from_machinery_only_the_fast_set_and_trains_helpers():
    graph = import_graph()
    assert set(CORE) == {m for m in graph if not m.startswith("machinery")}
    wrong = {m: sorted(d for d in graph[m][0] if d.startswith("machinery")
                       and d not in CORE_MACHINERY.get(m, set()))
             for m in CORE if m != "__main__"}      # __main__ starts the command line
    assert not any(wrong.values()), {m: d for m, d in wrong.items() if d}
