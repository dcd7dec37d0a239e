"""Imports point one way: down. Each module of minialign may import only modules of a LOWER
level in LEVELS, so no import circle can form (the replicate <-> report circle of #10 would
fail here), and the core never reaches up into the machinery that runs it.

The core (minialign/*.py) stands on its own: two of its modules import from machinery/, and
only these (CORE_MACHINERY): model imports machinery.fastpath.fast, the fast layer set, in the
one place that picks a layer set (it imports only layers and the fast path below it); train
imports run/'s rundir, checkpoint, files and monitor (training reads its captions, writes a run
directory, evaluates and prints its progress; they import only numpy, tqdm and the core below
train).

machinery/ is in folders, one level each (FOLDER_LEVELS): a module imports machinery modules of
its own folder or of a lower folder only, and no folder holds more than 12 modules.

Parsed, not executed: every `import minialign.x`, `from minialign.x import y`, `from . import
x`, `from .x import y` and `from ..x import y` anywhere in a file, function bodies included.
"""
import ast
from pathlib import Path

import minialign
from minialign.machinery.course.copy import left_out

PKG = Path(minialign.__file__).parent
LEVELS = {  # module: level; a module imports only modules of a lower level
    # the core
    "losses": 0, "metrics": 0, "minialign": 0, "optim": 0, "tokenizer": 0, "layers": 1, "wordpiece": 1,
    "data": 2, "model": 5, "objectives": 6, "train": 10, "__main__": 20,
    # machinery/ and its folders' __init__.py
    "machinery": 0, "machinery.course": 0, "machinery.experiment": 0, "machinery.fastpath": 0,
    "machinery.grid": 0, "machinery.images": 0, "machinery.run": 0, "machinery.timing": 0,
    "machinery.grading": 17, "machinery.cli": 18,
    # fastpath/
    "machinery.fastpath.rows": 0, "machinery.fastpath.fast_rows": 2,
    "machinery.fastpath.fast_layers": 3, "machinery.fastpath.fast": 4,
    # run/
    "machinery.run.blasenv": 0, "machinery.run.files": 0, "machinery.run.flags": 0,
    "machinery.run.dirlock": 1, "machinery.run.machine": 2, "machinery.run.rundir": 2,
    "machinery.run.checkpoint": 4, "machinery.run.monitor": 8, "machinery.run.encoder": 12,
    "machinery.run.scores": 3, "machinery.run.runlock": 2,
    # course/
    "machinery.course.copy": 0, "machinery.course.child": 0, "machinery.course.exercises": 1,
    "machinery.course.grade": 2, "machinery.course.classes": 3,
    # images/
    "machinery.images.synthetic_v2": 0, "machinery.images.embeddings": 2,
    "machinery.images.download": 4, "machinery.images.photos": 6,
    "machinery.images.bert_vocab": 6,
    "machinery.images.caption_stats": 9, "machinery.images.coco": 12,
    "machinery.images.scoring": 11, "machinery.images.recorded": 4,
    "machinery.images.evaluate": 12,
    "machinery.images.export": 12,
    "machinery.images.synthetic": 12,
    # timing/
    "machinery.timing.gemms": 4, "machinery.timing.bench": 12,
    "machinery.timing.bench_torch": 14,
    # experiment/
    "machinery.experiment.speed": 0, "machinery.experiment.figures": 2,
    "machinery.experiment.scaling": 6, "machinery.experiment.results_md": 7,
    "machinery.experiment.rescore": 12, "machinery.experiment.protocol": 12,
    "machinery.experiment.baselines": 13, "machinery.experiment.report": 14,
    "machinery.experiment.compare": 15, "machinery.experiment.scaling_report": 15,
    "machinery.experiment.agreement": 16,
    # grid/
    "machinery.grid.slurm": 2, "machinery.grid.memory": 3, "machinery.grid.jobs": 4, "machinery.grid.estimate": 14,
    "machinery.grid.scored": 15, "machinery.grid.replicate": 16, "machinery.grid.scaling_run": 17,
    "machinery.grid.slurm_runs": 17, "machinery.grid.ablations": 17,
}
# one level per folder of machinery/: a module imports machinery modules only of its own folder
# or of a folder of a lower level (each folder's __init__.py says what it may import)
FOLDER_LEVELS = {"machinery.fastpath": 1, "machinery.run": 2, "machinery.course": 2,
                 "machinery.images": 3, "machinery.timing": 3, "machinery.experiment": 4,
                 "machinery.grid": 5, "machinery": 6}
MAX_MODULES_PER_FOLDER = 12
# imports inside a function, each for a reason other than dodging a circle
LAZY_IMPORTS = {
    ("machinery.images.export", "torch"),                    # the optional [export] extra
    ("machinery.images.export", "transformers"),
    ("machinery.images.coco", "machinery.images.download"),  # only `data` needs the network code
    ("machinery.images.coco", "machinery.images.photos"),
    ("machinery.images.coco", "machinery.images.bert_vocab"),
    ("machinery.course.grade", "pytest"),                    # the [test] extra: only grading
    ("machinery.course.child", "pytest"),                    # after the copy's own imports
    ("__main__", "machinery.cli"),     # not for grade, whose copy's own files may not import
}
CORE = ("minialign", "tokenizer", "wordpiece", "data", "layers", "model", "losses", "optim",
        "metrics", "objectives", "train", "__main__")
CORE_MACHINERY = {"model": {"machinery.fastpath", "machinery.fastpath.fast"},
                  "train": {"machinery.run.rundir", "machinery.run.checkpoint",
                            "machinery.run.files", "machinery.run.monitor"}}
IMAGE_SIDE = {m for m in LEVELS if m.startswith("machinery.images.")}  # train never reaches it


def module_name(path):
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "minialign"


PACKAGES = {module_name(p) for p in PKG.rglob("__init__.py")}


def package_of(module):
    """The package a module's relative imports start from, as a list of names."""
    if module == "minialign":
        return ["minialign"]
    parts = module.split(".")
    return ["minialign"] + (parts if module in PACKAGES else parts[:-1])


def folder_of(module):
    """machinery.run.files -> machinery.run; machinery.cli -> machinery; a core module -> None."""
    if not module.startswith("machinery"):
        return None
    return module if module in PACKAGES else module.rsplit(".", 1)[0]


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
    for module in LEVELS:       # a student copy leaves the fast path's layer code out
        if module not in graph and left_out(f"minialign/{module.replace('.', '/')}.py"):
            graph[module] = (set(), set(), set())
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
    assert {"data", "model", "objectives", "machinery.run.rundir"} <= seen  # the walk works
    assert not seen & IMAGE_SIDE, f"train reaches {sorted(seen & IMAGE_SIDE)}"
    assert not set.union(*(graph[m][1] for m in seen)) & {"torch", "transformers", "PIL"}


def test_the_core_imports_from_machinery_only_the_fast_set_and_trains_helpers():
    graph = import_graph()
    assert set(CORE) == {m for m in graph if not m.startswith("machinery")}
    wrong = {m: sorted(d for d in graph[m][0] if d.startswith("machinery")
                       and d not in CORE_MACHINERY.get(m, set()))
             for m in CORE if m != "__main__"}      # __main__ starts the command line
    assert not any(wrong.values()), {m: d for m, d in wrong.items() if d}


def test_every_folder_has_a_level_and_a_docstring_and_at_most_12_modules():
    folders = {m for m in PACKAGES if m.startswith("machinery")}
    assert folders == set(FOLDER_LEVELS)
    for folder in folders:
        init = PKG.joinpath(*folder.split("."), "__init__.py")
        assert ast.get_docstring(ast.parse(init.read_text())), f"{folder}/__init__.py: no docstring"
        modules = [m for m in LEVELS if m not in PACKAGES and folder_of(m) == folder]
        assert len(modules) <= MAX_MODULES_PER_FOLDER, f"{folder}: {len(modules)} modules"


def test_folders_import_only_their_own_or_lower_folders():
    wrong = [f"{m} ({folder_of(m)}, level {FOLDER_LEVELS[folder_of(m)]}) imports {d} "
             f"({folder_of(d)}, level {FOLDER_LEVELS[folder_of(d)]})"
             for m, (ours, _, _) in import_graph().items() if folder_of(m) for d in sorted(ours)
             if folder_of(d) and folder_of(d) != folder_of(m)
             and FOLDER_LEVELS[folder_of(d)] >= FOLDER_LEVELS[folder_of(m)]]
    assert not wrong, "\n".join(wrong)
