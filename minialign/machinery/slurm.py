"""Hand a grid's runs to Slurm, the scheduler university clusters run, instead of running them
here: one job-array task per run.

    OUT/slurm/manifest.tsv   one line per task: index, run name, the shell command it runs
    OUT/slurm/array.sh       the sbatch script: task i runs line i of the manifest
    OUT/slurm/logs/          each task's stdout and stderr (%A_%a: array job id, task index)

Every command trains with --resume, so a task that is requeued, or resubmitted by a rerun
after a failure, continues its run instead of starting over; a rerun writes a new manifest
holding only the runs not finished yet. scripts/slurm-single-node.sh starts a real one-node
Slurm on a Linux machine for testing.
"""
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from .files import atomic_write_bytes

SLURM_DIR = "slurm"
MANIFEST = "manifest.tsv"
SCRIPT = "array.sh"


def write_array(out, tasks, cpus, mem_mb, job_name="minialign", time_limit=None):
    """Write OUT/slurm/manifest.tsv and OUT/slurm/array.sh for `tasks`.
    tasks: list of (name, argv) pairs, argv a list of str (the command, run from OUT's parent
    folder's working directory as given); cpus: cores per task (>= 1); mem_mb: memory per task
    in MB (>= 1); time_limit: Slurm's --time ("HH:MM:SS"), None for the partition's default.
    Returns the script's path. Raises ValueError for an empty task list or a name with a tab
    or newline."""
    if not tasks:
        raise ValueError("write_array: no tasks")
    lines = []
    for i, (name, argv) in enumerate(tasks):
        if any(c in name for c in "\t\n"):
            raise ValueError(f"write_array: run name {name!r} holds a tab or newline")
        lines.append(f"{i}\t{name}\t{shlex.join(argv)}\n")
    folder = Path(out) / SLURM_DIR
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / MANIFEST, "".join(lines).encode())
    header = [f"#SBATCH --job-name={job_name}", f"#SBATCH --cpus-per-task={cpus}",
              f"#SBATCH --mem={mem_mb}M", f"#SBATCH --array=0-{len(tasks) - 1}",
              f"#SBATCH --output={(folder / 'logs').resolve()}/%A_%a.log",
              f"#SBATCH --chdir={Path.cwd()}"]
    if time_limit:
        header.append(f"#SBATCH --time={time_limit}")
    script = "\n".join([
        "#!/bin/sh", *header,
        "# one task = one run: line $SLURM_ARRAY_TASK_ID of the manifest (written by minialign)",
        "set -eu",
        f"line=$(awk -F'\\t' -v i=\"$SLURM_ARRAY_TASK_ID\" '$1 == i {{print $3}}' "
        f"{shlex.quote(str((folder / MANIFEST).resolve()))})",
        '[ -n "$line" ] || { echo "no task $SLURM_ARRAY_TASK_ID in the manifest" >&2; exit 2; }',
        'echo "minialign task $SLURM_ARRAY_TASK_ID on $(hostname): $line"',
        'eval "exec $line"', ""])
    atomic_write_bytes(folder / SCRIPT, script.encode())
    (folder / SCRIPT).chmod(0o755)
    return folder / SCRIPT


def read_manifest(out):
    """[(index, name, command)] of OUT/slurm/manifest.tsv; [] when there is none."""
    path = Path(out) / SLURM_DIR / MANIFEST
    if not path.exists():
        return []
    return [(int(i), name, command) for i, name, command in
            (line.split("\t", 2) for line in path.read_text().splitlines() if line)]


def available():
    """None when sbatch is on the PATH and the controller answers, else the reason it is not."""
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (no sbatch on the PATH)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if "UP" not in ping.stdout:
        return f"the Slurm controller does not answer (scontrol ping: {ping.stdout.strip()})"
    return None


def submit(script):
    """sbatch the array script; returns the job id (str). Raises OSError with sbatch's message."""
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{script}: sbatch failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def wait(job_id, poll=0.5, timeout=None):
    """Block until job `job_id` has left the queue (polling squeue: quicker than sbatch
    --wait). Raises TimeoutError after `timeout` seconds (None: no limit)."""
    start = time.monotonic()
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True,
                         text=True).stdout.strip():
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"Slurm job {job_id} still queued after {timeout} s")
        time.sleep(poll)
