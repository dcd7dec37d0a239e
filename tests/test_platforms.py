"""The package on platforms other than this one: without fcntl and resource (as on Windows,
those imports made to fail in a child process), and with macOS's or another BLAS's answers
simulated (sys.platform, the memory and BLAS readers). docs/platforms.md lists what remains
assumed."""
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import POSIX_SIGNALS
from test_dirlock import started
from minialign.machinery.timing import bench
from minialign.machinery import cli
from minialign.machinery.run import dirlock, machine
from minialign.machinery.grid import jobs
from minialign.machinery.images import synthetic

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--d-model", "32", "--n-heads", "2", "--n-layers", "1", "--batch-photos", "16"]
HIDE = '''
import sys
HIDDEN = {"fcntl", "resource"}          # the POSIX-only modules minialign could lean on

class Hide:
    """Every import of a HIDDEN module fails, as on Windows."""
    def find_spec(self, name, path=None, target=None):
        if name in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

for name in HIDDEN:
    sys.modules.pop(name, None)
sys.meta_path.insert(0, Hide())
'''
HIDDEN_CHECK = "import fcntl"


@pytest.fixture(scope="module")
def hidden(tmp_path_factory):
    """An environment whose Python processes (and their spawned children) cannot import fcntl
    or resource: a sitecustomize.py first on PYTHONPATH."""
    site = tmp_path_factory.mktemp("hide")
    (site / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    check = subprocess.run([sys.executable, "-c", HIDDEN_CHECK], env=env, capture_output=True,
                           text=True)
    assert check.returncode == 1 and "No module named 'fcntl'" in check.stderr
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    captions, embeddings = synthetic.write_world(tmp_path_factory.mktemp("world"), 300, seed=0)
    return {"captions": str(captions), "embeddings": str(embeddings)}


def minialign(env, *argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "minialign", *map(str, argv)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, **kwargs)


def train_argv(world, out, steps):
    return ["train", "--objective", "bad_views", "--captions", world["captions"], "--out", out,
            "--steps", steps, "--eval-every", 10, "--warmup-steps", 2, "--threads", 1, *TINY]


# ---------------------------------------------------------------- without fcntl and resource
IMPORT_ALL = """
import importlib, pkgutil, minialign
from minialign.machinery.run import dirlock
from minialign.machinery.timing import bench
names = [m.name for m in pkgutil.walk_packages(minialign.__path__, "minialign.")]
for name in names:
    importlib.import_module(name)
print(len(names), dirlock.lock_backend(), bench.peak_rss_mb())
"""


def test_every_module_imports_without_fcntl_and_resource(hidden):
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=ROOT, env=hidden,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, backend, peak = done.stdout.split()
    assert int(count) > 40 and backend == "pidfile" and peak == "None"


@POSIX_SIGNALS
def test_train_ctrl_c_and_resume_without_fcntl_and_resource(hidden, world, tmp_path):
    out, steps = tmp_path / "run", 300
    run = subprocess.Popen([sys.executable, "-m", "minialign", *map(str, train_argv(
        world, out, steps))], cwd=ROOT, env=hidden, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    for line in run.stdout:                                   # a checkpoint at step 20's eval
        if "step 20 val" in line:
            break
    run.send_signal(signal.SIGINT)                            # Ctrl-C
    _, err = run.communicate(timeout=120)
    assert run.returncode == cli.EXIT_INTERRUPTED, err
    assert err.splitlines()[-1] == "minialign train: interrupted; " + cli.RESUME_HINT["train"]
    stopped = len((out / "log.jsonl").read_text().splitlines())
    assert 20 <= stopped < steps and not (out / dirlock.LOCK_FILE).exists()   # lock released
    resumed = minialign(hidden, *train_argv(world, out, steps), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    steps_logged = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text()
                    .splitlines()]
    assert steps_logged == list(range(1, steps + 1))
    whole = minialign(hidden, *train_argv(world, tmp_path / "whole", steps))
    assert whole.returncode == 0, whole.stderr
    assert (out / "model.npz").read_bytes() == (tmp_path / "whole" / "model.npz").read_bytes()


HOLDER = """
import sys, time
from minialign.machinery.run.dirlock import DirLock
lock = DirLock(sys.argv[1]).acquire()
print(lock.backend, flush=True)
time.sleep(60)
"""


def test_two_processes_one_directory_without_fcntl_and_resource(hidden, world, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=ROOT, env=hidden,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "pidfile"
        refused = minialign(hidden, *train_argv(world, out, 20))
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"minialign train: error: {out}: in use by another minialign process (pid "
            f"{holder.pid} on {socket.gethostname()}, started "
            + refused.stderr.split(", started ", 1)[1].strip()]
        assert refused.stderr.strip().endswith("wait for it to finish or stop it, then rerun "
                                               f"(its lock file: {out / dirlock.LOCK_FILE})")
        assert sorted(p.name for p in out.iterdir()) == [dirlock.LOCK_FILE]  # nothing written
    finally:
        holder.kill()                                    # SIGKILL: its pid file stays behind
        holder.wait()
    assert (out / dirlock.LOCK_FILE).exists()
    after = minialign(hidden, *train_argv(world, out, 20))         # a dead holder: taken over
    assert after.returncode == 0, after.stderr
    assert (out / "metrics.json").exists() and not (out / dirlock.LOCK_FILE).exists()


def test_a_pid_file_that_cannot_be_verified_says_it_is_safe_to_delete(hidden, world, tmp_path):
    """`train` without fcntl on a directory whose .lock is empty, names a live process that is
    not minialign, or another host: one line naming the lock file and that deleting it is safe
    when no minialign runs there, nothing written; a .lock naming a live pid with another start
    time (a reused pid) is taken over and the run trains."""
    out, lock = tmp_path / "run", tmp_path / "run" / dirlock.LOCK_FILE
    other = started([sys.executable, "-c", "import time; time.sleep(60)"])
    safe = ("if no minialign process runs on this directory, it is safe to delete that file, "
            "then rerun")
    command = dirlock.process_command(other.pid)                      # None without /proc
    running = f" (running `{command}`)" if command else ""
    try:
        for text, why in [("", "it is empty (a process killed while it started, or one "
                                "starting now)"),
                          (f"pid {other.pid} on {socket.gethostname()}, started x: sleep",
                           f"pid {other.pid} is alive{running} and cannot be verified as the "
                           f"minialign "
                           f"process that wrote it (no start time recorded)"),
                          ("pid 7 on elsewhere, started x: python -m minialign train",
                           "its process runs on elsewhere, which cannot be checked from here")]:
            out.mkdir(exist_ok=True)
            lock.write_text(text)
            refused = minialign(hidden, *train_argv(world, out, 20))
            holder = f" ({text})" if text else ""
            assert refused.returncode == 2 and refused.stderr.splitlines() == [
                f"minialign train: error: {out}: locked by {lock}{holder}, but {why}; {safe}"]
            assert sorted(p.name for p in out.iterdir()) == [dirlock.LOCK_FILE]
        if dirlock.process_start(other.pid) is None:
            pytest.skip("no /proc/<pid>/stat here: a reused pid cannot be told apart")
        lock.write_text(f"pid {other.pid} on {socket.gethostname()}, started x: python -m "
                        f"minialign train\nprocess start ticks 1\n")          # a reused pid
        trained = minialign(hidden, *train_argv(world, out, 20))
        assert trained.returncode == 0, trained.stderr
        assert (out / "metrics.json").exists() and not lock.exists()
    finally:
        other.kill()
        other.wait()


def test_replicate_evaluate_and_report_without_fcntl_and_resource(hidden, world, tmp_path):
    """The demo's path on a tiny grid: the estimate's timing processes (peak memory "not
    measured here"), two runs at once (spawned children, no signal masks needed), evaluate
    and report."""
    out = tmp_path / "grid"
    grid = minialign(hidden, "replicate", "--captions", world["captions"], "--embeddings",
                     world["embeddings"], "--out", out, "--seeds", 0, "--steps", 20,
                     "--eval-every", 10, "--warmup-steps", 2, "--lr-search", "off",
                     "--jobs", 2, *TINY)
    assert grid.returncode == 0, grid.stderr
    assert "peak memory per run not measured here" in grid.stdout
    assert len(list(out.glob("runs/*/model.npz"))) == 3
    run = next(out.glob("runs/good_views-*"))
    scored = minialign(hidden, "evaluate", "--run", run, "--embeddings", world["embeddings"],
                       "--json")
    assert scored.returncode == 0, scored.stderr
    scores = json.loads(scored.stdout)["runs"][0]
    assert scores["split"] == "test" and scores["mutual_knn"] > scores["mutual_knn_chance"]
    (out / "results.md").unlink()
    report = minialign(hidden, "report", out)
    assert report.returncode == 0, report.stderr
    assert "| good_views |" in (out / "results.md").read_text()


# ---------------------------------------------------------------- macOS and other BLAS libraries
class Usage:
    ru_maxrss = 2**30                           # what getrusage reports: KiB or bytes


class FakeResource:
    RUSAGE_SELF = 0

    @staticmethod
    def getrusage(who):
        return Usage


def test_peak_memory_reads_ru_maxrss_in_each_platforms_unit(monkeypatch):
    monkeypatch.setattr(bench, "resource", FakeResource)
    assert bench.peak_rss_mb("darwin") == 1024.0                 # bytes on macOS
    assert bench.peak_rss_mb("linux") == 1024.0 ** 2             # KiB on Linux
    assert bench.peak_rss_mb("freebsd13") == 1024.0 ** 2
    monkeypatch.setattr(sys, "platform", "darwin")                # this process, as on a Mac
    assert bench.peak_rss_mb() == 1024.0
    monkeypatch.setattr(bench, "resource", None)                 # Windows
    assert bench.peak_rss_mb("win32") is None and bench.rss_text(None) == "not measured here"
    assert bench.max_rss([None, 12.0, None]) == 12.0 and bench.max_rss([None]) is None
    assert bench.rss_text(1234.4) == "1,234 MB"


def fake_sysconf(names):
    """os.sysconf answering only `names` ({name: value}), ValueError for the rest, as a
    platform without that name does."""
    def sysconf(name):
        if name not in names:
            raise ValueError("unrecognized configuration name")
        return names[name]
    return sysconf


def test_jobs_memory_without_proc_meminfo(tmp_path):
    absent = tmp_path / "meminfo"
    macos = fake_sysconf({"SC_PHYS_PAGES": 4_194_304, "SC_PAGE_SIZE": 4096})   # 16 GiB
    assert jobs.available_memory(absent, macos) == (
        8192.0, "50% of 16,384 MB in all: what is free is not known here")
    bsd = fake_sysconf({"SC_AVPHYS_PAGES": 262_144, "SC_PHYS_PAGES": 4_194_304,
                        "SC_PAGE_SIZE": 4096})
    assert jobs.available_memory(absent, bsd) == (1024.0, "free memory")
    assert jobs.available_memory(absent, None) == (None, None)            # Windows
    assert jobs.default_jobs(2, 500, None, runs=9) == 2     # unknown: one run per core
    absent.write_text("MemTotal:       24684000 kB\nMemAvailable:    2048000 kB\n")
    assert jobs.available_memory(absent, macos) == (2000.0, "MemAvailable")    # Linux


@pytest.fixture
def other_blas(monkeypatch):
    """numpy on a BLAS that is not OpenBLAS: no openblas_* function, another build record."""
    library = {"name": "accelerate", "version": "unknown", "core": None}
    monkeypatch.setattr(machine, "_openblas", lambda function: None)
    monkeypatch.setattr(machine, "blas_library", lambda: dict(library))
    for name in ("VECLIB_MAXIMUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    machine.unpinned_note.cache_clear()
    before = machine.cores()
    yield library
    machine.unpinned_note.cache_clear()
    machine.rows.set_threads(before)


def test_another_blas_is_fixed_by_its_variable_or_the_command_says_once(other_blas,
                                                                         monkeypatch, capsys):
    assert machine.use_cores(2) is False and machine.use_cores(1) is False
    assert capsys.readouterr().err == (
        "note: numpy's BLAS (accelerate) may run several threads here (VECLIB_MAXIMUM_THREADS=1 "
        "before numpy is imported): a run's numbers can differ between --threads values "
        "(docs/platforms.md)\n")                                  # once, not twice
    monkeypatch.setenv("VECLIB_MAXIMUM_THREADS", "1")           # as python -m minialign sets it
    assert machine.use_cores(2) is True and machine.cores() == 2
    other_blas.update(name="mkl-sdl")
    assert machine.use_cores(2) is False and "(mkl-sdl)" in capsys.readouterr().err
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    assert machine.use_cores(2) is True
    other_blas.update(name="netlib")
    assert machine.use_cores(1) is False
    assert "no known way to fix its threads" in capsys.readouterr().err


def test_the_entry_point_sets_one_thread_unless_the_user_did_or_the_command_is_export():
    from minialign.machinery.run.blasenv import one_blas_thread
    env = {"MKL_NUM_THREADS": "4"}
    assert one_blas_thread(env, ["train", "--steps", "3"]) == [
        "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS"]
    assert env == {"MKL_NUM_THREADS": "4", "VECLIB_MAXIMUM_THREADS": "1",
                   "BLIS_NUM_THREADS": "1"}
    assert one_blas_thread({}, ["export", "--out", "e.npz"]) == []


SEE_NUMPY_LOAD = '''
import os, sys
class See:
    """Say what VECLIB_MAXIMUM_THREADS was when numpy was first imported."""
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            print("numpy sees", os.environ.get("VECLIB_MAXIMUM_THREADS"), file=sys.stderr)
            sys.meta_path.remove(self)
sys.meta_path.insert(0, See())
'''


def test_python_m_minialign_sets_the_variables_before_numpy_loads(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SEE_NUMPY_LOAD)
    env = {k: v for k, v in os.environ.items() if k != "VECLIB_MAXIMUM_THREADS"}
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{ROOT}"
    done = minialign(env, "train", "--help")
    assert done.returncode == 0 and done.stderr == "numpy sees 1\n"


def test_openblas_is_found_beside_numpy_without_proc_self_maps(tmp_path):
    """macOS and Windows have no /proc/self/maps: the OpenBLAS numpy's wheel ships beside it."""
    from minialign.machinery.fastpath import rows
    beside = [p for p in rows.openblas_paths()
              if Path(p).parent.name in ("numpy.libs", ".dylibs", "lib")]
    if not beside:
        pytest.skip("this numpy's OpenBLAS is not one its wheel ships (a system library)")
    assert set(beside) <= set(rows.openblas_paths(tmp_path / "no-maps"))


def test_blas_library_without_numpys_build_record(monkeypatch):
    """numpy < 1.26 has no show_config(mode="dicts"): OpenBLAS's own config names it."""
    recorded = machine.blas_library()
    if recorded["core"] is None:
        pytest.skip(f"numpy's BLAS here is {recorded['name']}, not OpenBLAS")

    def show_config():                          # numpy 1.25's signature: no mode
        pass
    monkeypatch.setattr(np, "show_config", show_config)
    assert machine.blas_library() == {"name": "openblas", "version": recorded["version"],
                                      "core": recorded["core"]}


# ---------------------------------------------------------------- the oldest Python allowed
VERMIN = "import sys, vermin; sys.argv[0] = 'vermin'; sys.exit(vermin.main())"


def vermin(*argv):
    if importlib.util.find_spec("vermin") is None:
        pytest.skip("vermin is not installed (a dev tool, not a dependency: pip install -e "
                    "'.[dev]' to run this check)")
    return subprocess.run([sys.executable, "-c", VERMIN, "-q", "--no-tips", "--violations",
                           "--eval-annotations", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_syntax_and_standard_library_need_nothing_newer_than_requires_python(tmp_path):
    """vermin's static check of every file of the package and its tests against pyproject's
    requires-python; it finds what it should (a `match` statement needs 3.10)."""
    oldest = re.search(r'^requires-python = ">=(3\.\d+)"$', (ROOT / "pyproject.toml").read_text(),
                       re.M).group(1)
    done = vermin(f"-t={oldest}-", "minialign", "tests")
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr
    (tmp_path / "new.py").write_text("match 1:\n    case 1:\n        pass\n")
    newer = vermin("-t=3.9-", tmp_path / "new.py")
    assert newer.returncode != 0 and "pattern matching requires !2, 3.10" in newer.stdout
