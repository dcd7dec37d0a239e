"""The package on platforms other than this one: without fcntl and resource (as on Windows,
those imports made to fail in a child process), and with macOS's or another BLAS's answers
simulated (sys.platform, the memory and BLAS readers). docs/platforms.md lists what remains
assumed."""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minialign.machinery import bench, cli, dirlock, jobs, machine, synthetic

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
from minialign.machinery import bench, dirlock
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
from minialign.machinery.dirlock import DirLock
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
        assert "wait for it to finish or stop it, then rerun" in refused.stderr
        assert sorted(p.name for p in out.iterdir()) == [dirlock.LOCK_FILE]  # nothing written
    finally:
        holder.kill()                                    # SIGKILL: its pid file stays behind
        holder.wait()
    assert (out / dirlock.LOCK_FILE).exists()
    after = minialign(hidden, *train_argv(world, out, 20))         # a dead holder: taken over
    assert after.returncode == 0, after.stderr
    assert (out / "metrics.json").exists() and not (out / dirlock.LOCK_FILE).exists()


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
