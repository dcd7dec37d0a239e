"""The front page and the docs work in a fresh clone: every relative link in README.md,
docs/*.md, docs/teacher/*.md and embeddings/README.md points at a file of the repository (and, into a Markdown
page, at one of its headings or anchors), and every `make TARGET` they name is a target of the
Makefile (`make -n TARGET` parses; nothing is run). Figures that exist only after `make demo`
are listed in AFTER_DEMO, and the line that links one says so."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "embeddings" / "README.md",
                *(ROOT / "docs").glob("*.md"), *(ROOT / "docs").glob("teacher/*.md")])
# written by `make demo`, not kept in the repository; the linking line says "after `make demo`"
AFTER_DEMO = {"results/synthetic/fig_alignment.png", "results/synthetic/fig_curves.png",
              "results/synthetic/fig_lr_search.png"}
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
MAKE = re.compile(r"(?:^|[\s;(=`])make\s+([a-z][\w-]*)", re.M)


def slug(heading):
    """GitHub's anchor of a Markdown heading: lowercase, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page):
    text = page.read_text()
    found = {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}
    return found | set(re.findall(r'<a id="([^"]+)">', text))


def links(page):
    """(line number, target) of every link of page outside code."""
    text = page.read_text()
    for m in LINK.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1) or m.group(2)


def test_the_front_page_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_relative_link_resolves():
    wrong = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, target in links(page):
            if re.match(r"[a-z]+:", target):             # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            relative = file.relative_to(ROOT).as_posix() if file.is_relative_to(ROOT) else None
            if relative in AFTER_DEMO:
                if "after `make demo`" not in lines[number - 1]:
                    wrong.append(f"{where} (exists only after make demo: say so on the line)")
                continue
            if relative is None or not file.exists():
                wrong.append(f"{where} (no such file in the repository)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                wrong.append(f"{where} (no heading or anchor #{anchor} in {relative})")
    assert not wrong, "\n".join(wrong)


def named_targets():
    """{target: first page:line naming it} for every `make TARGET` inside code of the pages."""
    found = {}
    for page in PAGES:
        text = page.read_text()
        for code in CODE.finditer(text):
            for m in MAKE.finditer(code.group(0)):
                line = text.count("\n", 0, code.start() + m.start(1)) + 1
                found.setdefault(m.group(1), f"{page.relative_to(ROOT)}:{line}")
    return found


def test_the_pages_name_make_targets():
    assert {"demo", "data", "embeddings", "replicate", "bench-torch", "grade"} <= set(named_targets())


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_every_make_target_named_exists():
    wrong = []
    for target, where in sorted(named_targets().items()):
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            wrong.append(f"{where}: make {target}: {done.stderr.strip().splitlines()[-1:]}")
    assert not wrong, "\n".join(wrong)
