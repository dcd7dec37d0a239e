"""The line counts of the tree against its budgets: `python scripts/lines.py` (make lines).
Exit 1 if one is over. Docstring and comment lines are counted against code lines in the
modules a student reads."""
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READING = [f"minialign/{m}.py" for m in ("tokenizer", "data", "layers", "model", "losses",
                                         "objectives", "optim", "metrics", "train")]
BUDGETS = [  # (what, files, budget)
    ("reading modules", lambda f: f in READING, 1200),
    ("minialign/", lambda f: f.startswith("minialign/") and f.endswith(".py"), 4500),
    ("tests/", lambda f: f.startswith("tests/"), 5000),
    ("docs/", lambda f: f.startswith("docs/") and f.endswith(".md"), 1200),
    ("README.md", lambda f: f == "README.md", 150),
    ("Makefile", lambda f: f == "Makefile", 80),
]
PROSE_RATIO = 0.35


def lines(path):
    return len((ROOT / path).read_text(encoding="utf-8").splitlines())


def prose_and_code(path):
    """(docstring + comment lines, other non-blank lines) of a Python file."""
    text = (ROOT / path).read_text(encoding="utf-8")
    prose = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) \
                and isinstance(body[0].value.value, str):
            prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.line.strip().startswith("#"):
            prose.add(tok.start[0])
    filled = {i + 1 for i, line in enumerate(text.splitlines()) if line.strip()}
    return len(prose & filled), len(filled - prose)


def main():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    over = False
    for what, chosen, budget in BUDGETS:
        n = sum(lines(f) for f in files if chosen(f) and (ROOT / f).is_file())
        over |= n > budget
        print(f"{what:<16} {n:>6,} lines   budget {budget:>6,}   {'OVER' if n > budget else 'ok'}")
    prose, code = map(sum, zip(*(prose_and_code(f) for f in READING)))
    over |= prose > PROSE_RATIO * code
    print(f"{'reading prose':<16} {prose / code:>6.2f} of code lines   budget {PROSE_RATIO:>6.2f}"
          f"   {'OVER' if prose > PROSE_RATIO * code else 'ok'}")
    total = sum(lines(f) for f in files if (ROOT / f).is_file() and not f.endswith(".json"))
    print(f"{'everything':<16} {total:>6,} lines (json data files aside)")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
