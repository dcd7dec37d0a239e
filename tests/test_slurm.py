"""machinery/grid/slurm.py and slurm_runs.py: the job-array script and its manifest, the runs a
grid hands to Slurm (each task's command rebuilds the run's config exactly; a rerun lists only
what is missing), the input checks before anything is written, and (where a Slurm controller
runs here: scripts/slurm-single-node.sh start) a tiny replicate grid submitted as an array
whose report equals the one `replicate --jobs 2` writes locally."""
import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from minialign import train
from minialign.machinery import cli
from minialign.machinery.grid import slurm, slurm_runs
from minialign.machinery.images import synthetic
from minialign.machinery.run.flags import TRAIN_FLAGS
from minialign.machinery.experiment.protocol import Protocol, run_name
from minialign.model import ModelConfig
from test_jobs import numbers  # results.json less wall times, folder, machine

ROOT = Path(__file__).resolve().parents[1]
NO_SLURM = slurm.available()
START_HINT = ("start one with: scripts/slurm-single-node.sh install && "
              "scripts/slurm-single-node.sh start")


# ---------------------------------------------------------------- the array itself
def test_manifest_round_trip_numbering_and_script_header(tmp_path):
    tasks = [("good_views-seed0", [["python", "-m", "minialign", "train", "--out", "a b"],
                                   ["echo", "done"]]),
             ("next_token-seed1", [["echo", "it's"]])]
    script = slurm.write_array(tmp_path, tasks, cpus=2, mem_mb=1500,
                               options=["--time=02:00:00"])
    assert script == (tmp_path / "slurm" / "array-1.sh").resolve()
    assert slurm.read_manifest(slurm.manifest_of(script)) == [
        (0, "good_views-seed0", "python -m minialign train --out 'a b' && echo done"),
        (1, "next_token-seed1", "echo 'it'\"'\"'s'")]
    for line in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=1500M", "#SBATCH --array=0-1",
                 "#SBATCH --time=02:00:00", f"#SBATCH --chdir={Path.cwd()}"):
        assert line in script.read_text().splitlines()
    assert slurm.write_array(tmp_path, tasks, cpus=2, mem_mb=1500,
                             options=["--time=02:00:00"]) == script     # the same: no new file
    again = slurm.write_array(tmp_path, tasks[1:], cpus=2, mem_mb=1500)
    assert again.name == "array-2.sh" and slurm.arrays(tmp_path) == [1, 2]
    assert "manifest-2.tsv" in again.read_text() and len(script.read_text()) > 0
    assert slurm.read_manifest(tmp_path / "nothing.tsv") == []


def test_script_runs_the_task_its_index_names_and_stops_at_a_failure(tmp_path):
    """The script itself, run by sh with SLURM_ARRAY_TASK_ID set, as a Slurm node would."""
    out = tmp_path / "marks"
    py = [sys.executable, "-c"]
    tasks = [(f"t{i}", [py + [f"open({str(out)!r} + '{i}', 'w').write('{i}')"]])
             for i in range(2)]
    tasks.append(("fails", [py + ["raise SystemExit(3)"], py + [f"open({str(out)!r}+'x', 'w')"]]))
    script = slurm.write_array(tmp_path, tasks, cpus=1, mem_mb=100)
    env = {"PATH": "/usr/bin:/bin"}
    subprocess.run(["sh", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": "1"}, check=True,
                   capture_output=True)
    assert [p.name for p in tmp_path.glob("marks*")] == ["marks1"]
    failed = subprocess.run(["sh", str(script)], env={**env, "SLURM_ARRAY_TASK_ID": "2"})
    assert failed.returncode == 3 and not (tmp_path / "marksx").exists()   # && stopped there
    bad = subprocess.run(["sh", str(script)], env={"SLURM_ARRAY_TASK_ID": "7"},
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no task 7 in the manifest" in bad.stderr


def test_write_array_refuses_nothing_and_bad_names(tmp_path):
    with pytest.raises(ValueError, match="no tasks"):
        slurm.write_array(tmp_path, [], cpus=1, mem_mb=1)
    with pytest.raises(ValueError, match="tab or newline"):
        slurm.write_array(tmp_path, [("a\tb", [["true"]])], cpus=1, mem_mb=1)
    with pytest.raises(ValueError, match="tab or newline"):
        slurm.write_array(tmp_path, [("a", [["echo", "x\ny"]])], cpus=1, mem_mb=1)
    assert not (tmp_path / "slurm").exists()


# ---------------------------------------------------------------- a grid's runs as tasks
def slurm_args(out, **kw):
    return argparse.Namespace(**{"out": str(out), "threads": None, "embeddings": "emb.npz",
                                 "sbatch_option": [], "submit": False, "wait": False, **kw})


def grid_protocol():
    base = train.TrainConfig(captions="caps.json", steps=50, batch_photos=8, eval_every=10)
    return Protocol(base=base, objectives=("good_views", "next_token"), seeds=(0, 1),
                    lr_min=1e-3, lr_max=1e-2, lr_per_decade=2, max_extensions=1)


def finish(out, name, score):
    """A fake finished run whose final val paraphrase R@1 is `score`."""
    run = Path(out) / "runs" / name
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.json").write_text(json.dumps(
        {"objective": name.split("-lr")[0], "final": {"val": {"paraphrase_R@1": score}}}))


def manifest_runs(out, n):
    return [name for _, name, _ in slurm.read_manifest(out / "slurm" / f"manifest-{n}.tsv")]


def test_manifest_of_a_grid_one_task_per_run_each_rebuilding_its_config(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "available", lambda: "no Slurm in this test")
    protocol = grid_protocol()
    job, tasks, held = slurm_runs.hand_over(protocol, slurm_args(tmp_path), None, vocab_size=50)
    assert job is None and held == {}
    grid = [f"{o}-lr1.00e-03-seed{s}" for s in (0, 1) for o in ("good_views", "next_token")]
    search = [f"{o}-lr{lr}-seed0" for o in ("good_views", "next_token")
              for lr in ("3.16e-03", "1.00e-02")]          # 1e-3 is the seed grid's run
    assert manifest_runs(tmp_path, 1) == list(tasks) == grid + search
    script = (tmp_path / "slurm" / "array-1.sh").read_text()
    assert "#SBATCH --array=0-7" in script and "#SBATCH --cpus-per-task=1" in script
    for _, name, command in slurm.read_manifest(tmp_path / "slurm" / "manifest-1.tsv"):
        train_argv, = [shlex.split(c) for c in command.split(" && ")]   # no embeddings: train only
        assert train_argv[:4] == [sys.executable, "-m", "minialign", "train"]
        assert train_argv[train_argv.index("--out") + 1] == str(tmp_path / "runs" / name)
        assert "--resume" in train_argv and train_argv[train_argv.index("--threads") + 1] == "1"
        cfg = slurm_runs.parsed_config(train_argv)
        assert run_name(cfg) == name and cfg.steps == 50 and cfg.captions == "caps.json"
    lr = slurm.read_manifest(tmp_path / "slurm" / "manifest-1.tsv")[4][2]
    assert " --lr 0.00316 " in lr                           # repr of the grid's 3.16e-3
    _, argvs = slurm_runs.task(protocol.base, tmp_path, 2, "emb.npz")
    assert argvs[1][3:] == ["evaluate", "--run", str(tmp_path / "runs" / run_name(protocol.base)),
                            "--embeddings", "emb.npz", "--rescore"]


def test_scaling_slurm_one_task_per_sized_run_each_rebuilding_its_size(world, tmp_path,
                                                                       monkeypatch, capsys):
    monkeypatch.setattr(slurm, "available", lambda: "no Slurm in this test")
    captions, embeddings = world
    out = tmp_path / "sweep"
    assert cli.main(["scaling", "--captions", str(captions), "--embeddings", str(embeddings),
                     "--out", str(out), "--widths", "16", "32", "--depths", "1", "--grid",
                     "cross", "--objectives", "good_views", "next_token", "--seeds", "0",
                     "--steps", "4", "--batch-photos", "8", "--warmup-steps", "1",
                     "--eval-every", "2", "--slurm"]) == 0
    names = [f"{o}-d{d}-l1-lr1.00e-03-seed0" for d in (16, 32) for o in ("good_views", "next_token")]
    assert manifest_runs(out, 1) == names
    for _, name, command in slurm.read_manifest(out / "slurm" / "manifest-1.tsv"):
        train_argv, evaluate_argv = [shlex.split(c) for c in command.split(" && ")]
        cfg = slurm_runs.parsed_config(train_argv)
        d_model = int(name.split("-d")[1].split("-")[0])
        assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == (d_model, 1, 1)
        assert train_argv[train_argv.index("--out") + 1] == str(out / "runs" / name)
        assert evaluate_argv[-3:] == ["--embeddings", str(embeddings), "--rescore"]


def test_a_rerun_lists_only_missing_runs_and_the_searchs_extension(tmp_path, monkeypatch):
    base = train.TrainConfig(captions="caps.json")
    protocol = Protocol(base=base, objectives=("good_views",), seeds=(0, 1), lr_min=1e-3,
                        lr_max=1e-2, lr_per_decade=1, max_extensions=1)
    held = {}
    monkeypatch.setattr(slurm, "available", lambda: None)
    monkeypatch.setattr(slurm, "queued", lambda out: dict(held))
    args = slurm_args(tmp_path)
    slurm_runs.hand_over(protocol, args, None, vocab_size=50)
    seeds = ["good_views-lr1.00e-03-seed0", "good_views-lr1.00e-03-seed1"]
    assert manifest_runs(tmp_path, 1) == seeds + ["good_views-lr1.00e-02-seed0"]
    held.update({"good_views-lr1.00e-03-seed1": "41"})          # still queued in Slurm
    finish(tmp_path, "good_views-lr1.00e-02-seed0", 0.5)        # the best so far, on the edge
    _, tasks, _ = slurm_runs.hand_over(protocol, args, None, vocab_size=50)
    assert list(tasks) == manifest_runs(tmp_path, 2) == ["good_views-lr1.00e-03-seed0"]
    finish(tmp_path, "good_views-lr1.00e-03-seed0", 0.1)        # 1e-2 wins: one point higher
    slurm_runs.hand_over(protocol, args, None, vocab_size=50)
    assert manifest_runs(tmp_path, 3) == ["good_views-lr1.00e-01-seed0"]
    held.clear()                                                # seed 1's task failed
    finish(tmp_path, "good_views-lr1.00e-01-seed0", 0.2)
    slurm_runs.hand_over(protocol, args, None, vocab_size=50)
    assert manifest_runs(tmp_path, 4) == ["good_views-lr1.00e-03-seed1"]
    finish(tmp_path, "good_views-lr1.00e-03-seed1", 0.3)
    assert slurm_runs.hand_over(protocol, args, None, vocab_size=50) == (None, {}, {})
    assert slurm.arrays(tmp_path) == [1, 2, 3, 4]              # nothing missing: no new array


def test_every_flag_a_task_passes_is_one_train_accepts():
    assert set(cli.TRAIN_FIELDS) == set(TRAIN_FLAGS)


def test_a_config_train_flags_cannot_give_is_refused():
    cfg = train.TrainConfig(captions="c.json", grad_clip=0.5)   # grad_clip has no flag
    with pytest.raises(ValueError, match=r"grad_clip differ"):
        slurm_runs.task(cfg, "out", 1, None)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic.write_world(tmp_path_factory.mktemp("slurm") / "world", n_scenes=300, seed=0,
                                 world="v1")


def test_the_task_command_writes_the_config_json_a_local_run_writes(world, tmp_path):
    captions, _ = world
    cfg = train.TrainConfig(captions=str(captions), steps=2, batch_photos=8, eval_every=2,
                            lr=3.16e-3, weight_decay=0.1 + 0.2, warmup_steps=1,
                            model=ModelConfig(d_model=8, n_layers=1, n_heads=2))
    _, (argv,) = slurm_runs.task(cfg, tmp_path / "slurm", 1, None)
    subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
                   capture_output=True)                           # `train`, as the task runs it
    train.train(cfg, tmp_path / "local" / "runs" / run_name(cfg))
    config = [json.loads((tmp_path / d / "runs" / run_name(cfg) / "config.json").read_text())
              for d in ("slurm", "local")]
    assert config[0] == config[1]
    assert config[0]["config"]["weight_decay"] == 0.30000000000000004


def grid_argv(world, out, *extra):
    captions, embeddings = world
    return ["replicate", "--captions", str(captions), "--embeddings", str(embeddings),
            "--out", str(out), "--objectives", "good_views", "next_token", "--seeds", "0", "1",
            "--steps", "12", "--batch-photos", "16", "--warmup-steps", "2", "--eval-every", "6",
            "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--lr-search", "off",
            "--threads", "1", *extra]


@pytest.mark.parametrize("extra, message", [
    (["--submit"], "--submit needs --slurm"),
    (["--slurm", "--jobs", "2"], "--jobs runs the grid here"),
    (["--slurm", "--dry-run"], "--dry-run times the grid here"),
    (["--slurm", "--sbatch-option", "time=1:00:00"], "--sbatch-option 'time=1:00:00': must be"),
    (["--slurm", "--submit"], "--submit: no Slurm in this test; on this machine: "),
    (["--slurm", "--captions", "missing.json"], "missing.json"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(world, tmp_path, capsys, monkeypatch,
                                                      extra, message):
    monkeypatch.setattr(slurm, "available", lambda: "no Slurm in this test")
    assert cli.main(grid_argv(world, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("minialign replicate: error: ")
    assert message in err[0] and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a real Slurm
def run_cli(argv):
    done = subprocess.run([sys.executable, "-m", "minialign", *argv], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout




@pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm here: {NO_SLURM}; {START_HINT}")
def test_real_slurm_grid_gives_the_report_of_jobs_2(world, tmp_path):
    local, out = tmp_path / "local", tmp_path / "slurm"
    run_cli(grid_argv(world, local, "--jobs", "2", "--no-estimate"))
    said = run_cli(grid_argv(world, out, "--slurm", "--submit", "--sbatch-option=--hold"))
    job = said.split("submitted job ")[1].split()[0]
    try:
        runs = [f"{o}-lr1.00e-03-seed{s}" for s in (0, 1) for o in ("good_views", "next_token")]
        assert sorted(slurm.queued(out)) == sorted(runs)         # held: pending in Slurm
        again = run_cli(grid_argv(world, out, "--slurm", "--submit"))  # a rerun: nothing new
        assert "4 run(s) queued or running in Slurm already" in again and slurm.arrays(out) == [1]
        subprocess.run(["scontrol", "release", job], check=True)
        run_cli(grid_argv(world, out, "--slurm", "--wait"))      # waits, then the report
    finally:
        subprocess.run(["scancel", job])                         # nothing left held on failure
    assert numbers(out) == numbers(local)
    for name in runs:
        assert (json.loads((out / "runs" / name / "config.json").read_text())
                == json.loads((local / "runs" / name / "config.json").read_text()))
    assert sorted(p.name for p in (out / "slurm" / "logs").glob("*.log")) == [
        f"{job}_{i}.log" for i in range(4)]
    finished = run_cli(grid_argv(world, out, "--slurm", "--submit"))
    assert "nothing missing" in finished and slurm.arrays(out) == [1]


@pytest.mark.skipif(NO_SLURM is not None, reason=f"no Slurm here: {NO_SLURM}; {START_HINT}")
def test_real_slurm_sweep_gives_the_report_of_jobs_2(world, tmp_path):
    captions, embeddings = world
    sweep = ["scaling", "--captions", str(captions), "--embeddings", str(embeddings),
             "--widths", "8", "16", "--depths", "1", "--grid", "cross", "--objectives",
             "good_views", "next_token", "--seeds", "0", "--steps", "6", "--batch-photos", "16",
             "--warmup-steps", "2", "--eval-every", "3"]
    run_cli(sweep + ["--out", str(tmp_path / "local"), "--jobs", "2", "--no-estimate"])
    run_cli(sweep + ["--out", str(tmp_path / "slurm"), "--slurm", "--wait"])
    assert numbers(tmp_path / "slurm") == numbers(tmp_path / "local")
    assert len(slurm.read_manifest(tmp_path / "slurm" / "slurm" / "manifest-1.tsv")) == 4
