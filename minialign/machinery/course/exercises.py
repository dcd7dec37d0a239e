"""The course kit's exercises (docs/course.md), found in the working code and blanked into a
student copy of the repository.

An exercise is a function body (or its end, after the input checks) between two comments, in
a top-level module of minialign:

    def layernorm_backward(dy, cache):
        \"\"\"dy: (..., D) -> dx (..., D), dgamma (D,), dbeta (D,).\"\"\"
        # --- exercise 4: LayerNorm backward ---
        xhat, inv_std, gamma = cache
        ...
        return dx, dgamma, dbeta
        # --- end of exercise 4 ---

`python -m minialign exercises OUT` copies the repository (its tracked files: `git ls-files`;
outside a git checkout, the tree without caches, runs and results) into the new or empty OUT,
each marked body replaced by ONE line at its indentation,

        raise NotImplementedError("exercise 4: LayerNorm backward — see docs/course.md#exercise-4")

and every other byte the same (the two comments stay, so the student sees where to write).
`python -m minialign grade` (grade.py) runs each exercise's tests; restore_solutions puts the
working bodies back into a copy. The numbers 1..N, each once, are the teaching order.
"""
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .copy import STUDENT_FILE, is_copy, is_student_copy, left_out

START = re.compile(r"^( *)# --- exercise (\d+): (.+) ---$")      # opens exercise N
END = re.compile(r"^( *)# --- end of exercise (\d+) ---$")        # closes it
STUB = re.compile(r"^exercise (\d+): (.+) — see (\S+)$")          # a stub's message
DOCS = "docs/course.md"              # the lesson plan: one section per exercise, #exercise-N
ROOT = Path(__file__).resolve().parents[3]    # the repository (or a student copy) of this code
# Outside a git checkout, what a copy leaves out: the .gitignore's entries
SKIPPED_DIRS = {".git", "__pycache__", ".pytest_cache", ".venv", "build", "runs", "results",
                "coco"}
SKIPPED_SUFFIXES = (".pyc", ".npz", ".egg-info")


@dataclass(frozen=True)
class Exercise:
    """One marked body: number and title as the opening comment gives them; path relative to
    the root ("minialign/layers.py"); start, end: 0-based lines of the two comments."""
    number: int
    title: str
    path: str
    start: int
    end: int

    @property
    def docs(self):
        """Where the lesson plan explains it: docs/course.md#exercise-N."""
        return f"{DOCS}#exercise-{self.number}"

    @property
    def message(self):
        """What its stub's NotImplementedError says (STUB reads it back)."""
        return f"exercise {self.number}: {self.title} — see {self.docs}"

    @property
    def stub(self):
        """The line that replaces the body in the student copy."""
        return f'raise NotImplementedError("{self.message}")'


def parse(text, path):
    """The exercises marked in one file's text, in file order. Raises ValueError (naming
    path:line) for an opening comment without its end, an end without its opening, a nested
    or an empty pair, or two comments at different indentations."""
    found, open_ = [], None
    for i, line in enumerate(text.splitlines()):
        start, end = START.match(line), END.match(line)
        if start and open_:
            raise ValueError(f"{path}:{i + 1}: exercise {start[2]} opens inside exercise "
                             f"{open_[2]} (line {open_[0] + 1})")
        if start:
            open_ = (i, start[1], int(start[2]), start[3])
        elif end:
            if not open_ or int(end[2]) != open_[2] or end[1] != open_[1]:
                raise ValueError(f"{path}:{i + 1}: '# --- end of exercise {end[2]} ---' does "
                                 f"not close an opening comment of that number and indentation")
            if i == open_[0] + 1:
                raise ValueError(f"{path}:{i + 1}: exercise {end[2]} marks no code")
            found.append(Exercise(open_[2], open_[3], path, open_[0], i))
            open_ = None
    if open_:
        raise ValueError(f"{path}:{open_[0] + 1}: exercise {open_[2]} is never closed")
    return found


def find_exercises(root=ROOT):
    """Every exercise in root/minialign/*.py, by number. Raises ValueError unless the numbers
    are 1..N, each once (and as parse)."""
    found = []
    for path in sorted((Path(root) / "minialign").glob("*.py")):
        found += parse(path.read_text(encoding="utf-8"), f"minialign/{path.name}")
    found.sort(key=lambda e: e.number)
    numbers = [e.number for e in found]
    if numbers != list(range(1, len(found) + 1)):
        raise ValueError(f"exercise numbers must be 1..N, each once; found {numbers}")
    return found


def blank(text, path, solved=()):
    """text (a module's source) with each marked body replaced by its stub line, except the
    exercises numbered in `solved`. Every other line stays byte for byte."""
    lines = text.splitlines(keepends=True)
    for ex in reversed(parse(text, path)):
        if ex.number not in solved:
            indent = START.match(lines[ex.start].rstrip("\n"))[1]
            lines[ex.start + 1:ex.end] = [f"{indent}{ex.stub}\n"]
    return "".join(lines)


def splice(student, solution, path, numbers=None):
    """The student's text with the bodies of the exercises in `numbers` (None: all) taken from
    the solution's text instead: what a student who solved them exactly would have. Raises
    ValueError if the two texts mark different exercises."""
    mine, theirs = parse(student, path), {e.number: e for e in parse(solution, path)}
    if sorted(theirs) != [e.number for e in sorted(mine, key=lambda e: e.number)]:
        raise ValueError(f"{path}: the copy and the solution mark different exercises")
    lines, solved = student.splitlines(keepends=True), solution.splitlines(keepends=True)
    for ex in reversed(mine):
        if numbers is None or ex.number in numbers:
            sol = theirs[ex.number]
            lines[ex.start + 1:ex.end] = solved[sol.start + 1:sol.end]
    return "".join(lines)


def repository_files(root=ROOT):
    """The files of the repository at root, relative paths, sorted: `git ls-files` in a git
    checkout (those still on disk), else every file under root but SKIPPED_DIRS and
    SKIPPED_SUFFIXES (e.g. an unpacked student copy, which is no checkout)."""
    root = Path(root)
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True,
                                check=True).stdout.decode().split("\0")
        # a student copy inside a checkout's folder is no checkout of its own
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                             capture_output=True, check=True).stdout.decode().strip()
        if Path(top).resolve() == root.resolve():
            return sorted(p for p in listed if p and (root / p).is_file())
    except (OSError, subprocess.CalledProcessError):          # no git, or not a checkout
        pass
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                  and not any(part in SKIPPED_DIRS or part.endswith(SKIPPED_SUFFIXES)
                              for part in p.relative_to(root).parts))


def check_out(out, root=ROOT):
    """Raise ValueError, one line, unless `out` can become a student copy: a new or empty
    directory, not a file, not below a file, not a dangling link, not inside the repository."""
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise ValueError(f"{out}: a symbolic link to {os.readlink(out)}, which does not exist; "
                         f"give a new or empty directory")
    above = next((p for p in out.absolute().parents if p.exists() and not p.is_dir()), None)
    if above is not None:
        raise ValueError(f"{out}: {above} is a file, not a directory; the student copy needs "
                         f"a new or empty directory")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: is a file; the student copy needs a new or empty directory")
    here, repo = out.resolve(), Path(root).resolve()
    if here == repo or repo in here.parents:
        raise ValueError(f"{out}: inside the repository {repo}; the student copy goes outside "
                         f"it, e.g. {repo.parent / 'course'}")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"{out}: not empty; the student copy needs a new or empty directory")


def write_student_copy(out, root=ROOT, solved=(), student=None):
    """Copy the repository at root into `out` (check_out), every exercise but those in
    `solved` blanked (blank), without what a copy leaves out (copy.LEFT_OUT); `student`: the
    id written to its copy.STUDENT_FILE. Raises ValueError before writing anything. Returns
    (exercises, number of files written)."""
    out, root = Path(out), Path(root)
    check_out(out, root)
    exercises = find_exercises(root)
    unknown = sorted(set(solved) - {e.number for e in exercises})
    if unknown:
        raise ValueError(f"--solved: no exercise {', '.join(map(str, unknown))} "
                         f"(there are 1..{len(exercises)})")
    marked = {e.path for e in exercises}
    files = [rel for rel in repository_files(root) if not left_out(rel)]
    for rel in files:
        src, dst = root / rel, out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel in marked:
            dst.write_bytes(blank(src.read_bytes().decode("utf-8"), rel, solved).encode("utf-8"))
            shutil.copymode(src, dst)
        else:
            shutil.copy2(src, dst)
    if student:
        (out / STUDENT_FILE).write_text(f"{student}\n", encoding="utf-8")
    return exercises, len(files)


def restore_solutions(copy, root=ROOT, numbers=None):
    """Put the working bodies of the exercises in `numbers` (None: all) from the repository at
    root back into the student copy at `copy` (splice), leaving the rest of it as it is.
    Raises ValueError (before writing) if copy is no copy or a number is no exercise. Returns
    the paths rewritten."""
    if not is_copy(copy):
        raise ValueError(f"{copy}: no student copy there (pyproject.toml and "
                         f"minialign/__init__.py)")
    exercises = find_exercises(root)
    unknown = sorted(set(numbers or ()) - {e.number for e in exercises})
    if unknown:
        raise ValueError(f"--restore: no exercise {', '.join(map(str, unknown))} "
                         f"(there are 1..{len(exercises)})")
    paths = sorted({e.path for e in exercises if numbers is None or e.number in numbers})
    texts = {rel: splice((Path(copy) / rel).read_bytes().decode("utf-8"),
                         (Path(root) / rel).read_bytes().decode("utf-8"), rel, numbers)
             for rel in paths}                      # every file spliced before any is written
    for rel, text in texts.items():
        (Path(copy) / rel).write_bytes(text.encode("utf-8"))
    return paths


def stub_number(err):
    """N when err (an exception) is exercise N's stub's NotImplementedError, else None."""
    stub = STUB.match(str(err)) if isinstance(err, NotImplementedError) else None
    return int(stub[1]) if stub else None


def stub_error(number, root=ROOT):
    """The NotImplementedError exercise `number`'s stub raises, for a parent process to raise
    when its child reached that stub (jobs.py), as if it had reached it itself."""
    return NotImplementedError(find_exercises(root)[number - 1].message)


def unfinished(err):
    """The one line for a command that reached an exercise's stub (err: the NotImplementedError
    it raised), or None when err is no exercise stub."""
    stub = STUB.match(str(err))
    if not stub:
        return None
    return (f"exercise {stub[1]} ({stub[2]}) is not done yet: see {stub[3]}; "
            f"`python -m minialign grade {stub[1]}` checks it")


def format_list(exercises):
    """The exercises as a table: number, title, where (the exercises command's --list)."""
    width = max(len(e.title) for e in exercises)
    return "\n".join(f"{e.number:>2}  {e.title:<{width}}  {e.path}:{e.start + 1}"
                     for e in exercises)


def run_exercises(out, solved=(), list_only=False, root=ROOT, restore=None, student=None):
    """`python -m minialign exercises OUT`: write the student copy, say what it holds and what
    comes next; --restore N ...: put those reference bodies back into the copy OUT; --list:
    only print the exercises."""
    if list_only:
        print(format_list(find_exercises(root)))
        return
    if out is None:
        raise ValueError("say where the student copy goes: python -m minialign exercises OUT "
                         "(make exercises OUT=...)")
    if (restore is not None or solved) and is_student_copy(root):
        raise ValueError(f"{Path(root)} is a student copy: it holds no solutions to "
                         f"{'restore' if restore is not None else 'leave in (--solved)'}; run "
                         f"this from the repository (the teacher's checkout)")
    if restore is not None:
        if solved or student:
            raise ValueError("--restore: alone (not with --solved or --student)")
        paths = restore_solutions(out, root, restore)
        print(f"restored exercise(s) {', '.join(map(str, sorted(restore)))} in {out} "
              f"({', '.join(paths)})")
        return
    exercises, n_files = write_student_copy(out, root, solved, student)
    blanked = [e for e in exercises if e.number not in solved]
    print(f"wrote {out}: {n_files} files, {len(blanked)} of {len(exercises)} exercises blanked "
          f"({DOCS} says what each teaches)" + (f", student {student}" if student else ""))
    print(f"next: cd {out} && pip install -e '.[test]' && make grade")
