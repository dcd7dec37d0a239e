"""machinery/slurm.py: the job-array script and manifest, and (where a Slurm controller runs
here: scripts/slurm-single-node.sh start) a real submission of a small array."""
import subprocess
import sys

import pytest

from minialign.machinery import slurm


def test_manifest_round_trip_and_script_header(tmp_path):
    tasks = [("good_views-seed0", ["python", "-m", "minialign", "train", "--out", "a b"]),
             ("next_token-seed1", ["echo", "it's"])]
    script = slurm.write_array(tmp_path, tasks, cpus=2, mem_mb=1500, time_limit="02:00:00")
    assert slurm.read_manifest(tmp_path) == [
        (0, "good_views-seed0", "python -m minialign train --out 'a b'"),
        (1, "next_token-seed1", "echo 'it'\"'\"'s'")]
    text = script.read_text()
    for line in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=1500M", "#SBATCH --array=0-1",
                 "#SBATCH --time=02:00:00"):
        assert line in text.splitlines()
    assert slurm.read_manifest(tmp_path / "nothing") == []


def test_script_runs_the_task_its_index_names(tmp_path):
    """The script itself, run by sh with SLURM_ARRAY_TASK_ID set, as a Slurm node would."""
    out = tmp_path / "marks"
    tasks = [(f"t{i}", [sys.executable, "-c", f"open({str(out)!r} + '{i}', 'w').write('{i}')"])
             for i in range(3)]
    script = slurm.write_array(tmp_path, tasks, cpus=1, mem_mb=100)
    subprocess.run(["sh", str(script)], env={"SLURM_ARRAY_TASK_ID": "1", "PATH": "/usr/bin:/bin"},
                   check=True, capture_output=True)
    assert [p.name for p in tmp_path.glob("marks*")] == ["marks1"]
    bad = subprocess.run(["sh", str(script)], env={"SLURM_ARRAY_TASK_ID": "7"},
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no task 7 in the manifest" in bad.stderr


def test_write_array_refuses_nothing_and_bad_names(tmp_path):
    with pytest.raises(ValueError, match="no tasks"):
        slurm.write_array(tmp_path, [], cpus=1, mem_mb=1)
    with pytest.raises(ValueError, match="tab or newline"):
        slurm.write_array(tmp_path, [("a\tb", ["true"])], cpus=1, mem_mb=1)


@pytest.mark.skipif(slurm.available() is not None, reason=f"no Slurm here: {slurm.available()} "
                    "(scripts/slurm-single-node.sh install && scripts/slurm-single-node.sh start)")
def test_real_slurm_runs_every_task_of_the_array(tmp_path):
    tasks = [(f"t{i}", [sys.executable, "-c", f"open('{tmp_path}/done{i}', 'w').write('ok')"])
             for i in range(3)]
    job = slurm.submit(slurm.write_array(tmp_path, tasks, cpus=1, mem_mb=100))
    slurm.wait(job, poll=0.2, timeout=120)
    assert sorted(p.name for p in tmp_path.glob("done*")) == ["done0", "done1", "done2"]
