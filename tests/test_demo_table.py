"""The demo table of docs/results.md is generated, not typed: it is exactly what `python -m
minialign compare docs/demo/results.json --table` prints of the committed summary, and that
summary was made under the protocol `make demo` runs today (so a change of the demo's settings
that moves its numbers fails here, saying how to regenerate both)."""
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from minialign.machinery.cli import parser, protocol_from_args
from minialign.machinery.experiment import agreement
from minialign.machinery.experiment.compare import flat

ROOT = Path(__file__).resolve().parents[1]
SUMMARY, PAGE = ROOT / agreement.DEFAULT_REFERENCE, ROOT / "docs" / "results.md"
REGENERATE_ALL = (f"make demo && python -m minialign compare results/synthetic --export "
                  f"{agreement.DEFAULT_REFERENCE} && {agreement.REGENERATE}")


def test_the_docs_table_is_the_one_generated_from_the_committed_summary():
    generated = agreement.format_table(agreement.load(SUMMARY))
    assert agreement.table_in(PAGE) == generated, (
        f"docs/results.md's demo table is not the one generated from "
        f"{agreement.DEFAULT_REFERENCE}; regenerate it with `{agreement.REGENERATE}`")


def demo_args(*variables):
    """The parsed replicate command `make demo` would run now (make -n, the Makefile's
    defaults: no variable taken from this environment, but `variables`, e.g. "DTYPE=float64")."""
    done = subprocess.run(["make", "-n", "demo", *variables], cwd=ROOT, capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"]}, check=True)
    line = next(l for l in done.stdout.replace("\\\n", " ").splitlines()
                if "-m minialign replicate" in l)
    words = shlex.split(line.split(" || ")[0])      # the command, not make's quiet exit code
    return parser().parse_args(words[words.index("minialign") + 1:])


def demo_protocol(*variables):
    """The Protocol `make demo` would run now, parsed as the command line parses it."""
    args = demo_args(*variables)
    return json.loads(json.dumps(dataclasses.asdict(protocol_from_args(args))))


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_dtype_float64_trains_the_same_demo_in_float64_into_its_own_directory():
    """DTYPE=float64 (#29, docs/protocol.md): the demo's protocol but for the arithmetic, into
    a directory of its own (and -reference-float64 with LAYERS=reference)."""
    plain, wide = flat(demo_protocol()), flat(demo_protocol("DTYPE=float64"))
    assert (plain["base.model.dtype"], wide["base.model.dtype"]) == ("float32", "float64")
    assert [n for n in sorted(plain) if plain[n] != wide[n]] == ["base.model.dtype"]
    default = demo_args()            # a student copy's default layer set is reference
    assert default.out == {"fast": "results/synthetic",
                           "reference": "results/synthetic-reference"}[default.layers]
    assert demo_args("DTYPE=float64").out == default.out + "-float64"
    assert demo_args("DTYPE=float64", "LAYERS=reference").out == "results/synthetic-reference-float64"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_committed_summary_was_made_under_the_demos_protocol():
    # read back as protocol.json is (a field added since reads as its default), then compared
    saved = flat(agreement.as_saved_now(agreement.load(SUMMARY)["protocol"]))
    now = flat(demo_protocol())
    differ = [f"{name} (saved {saved.get(name)!r}, make demo now {now.get(name)!r})"
              for name in sorted(set(saved) | set(now))
              if saved.get(name) != now.get(name) and name != "base.model.layers"]
    assert not differ, (
        f"{agreement.DEFAULT_REFERENCE} was made under other settings than `make demo` runs now: "
        f"{'; '.join(differ)}; regenerate it and the docs' table with `{REGENERATE_ALL}`")
