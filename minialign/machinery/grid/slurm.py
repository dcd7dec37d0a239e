"""Slurm, the scheduler university clusters run: a job array written, submitted, watched.

    OUT/slurm/manifest-N.tsv   one line per task: index, task name, the shell command it runs
    OUT/slurm/array-N.sh       the sbatch script: task i runs line i of manifest-N.tsv
    OUT/slurm/logs/            each task's stdout and stderr (%A_%a: array job id, task index)

N numbers the arrays written into OUT (1, 2, ...): a task still queued from an earlier array
keeps reading its own manifest while a rerun writes the next one. Which tasks Slurm still
holds is asked of squeue by script path (squeue's %o is the script's absolute path), so an
array submitted by hand with `sbatch` counts as much as one submitted by minialign.
What the tasks are (one run each, `replicate --slurm`) is slurm_runs.py's business;
scripts/slurm-single-node.sh starts a real one-node Slurm on a Linux machine for testing.
"""
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from ..run.files import atomic_write_bytes

SLURM_DIR = "slurm"
SCRIPT = "array-{}.sh"
MANIFEST = "manifest-{}.tsv"


def command_line(argvs):
    """The shell command of a task: each argv (a list of str) shell-quoted, joined by ' && '
    (the next runs only if the one before succeeded; the task's exit code is the first
    failure's). Raises ValueError for a tab or newline inside an argument (the manifest is one
    tab-separated line per task)."""
    for argv in argvs:
        bad = [a for a in argv if "\t" in a or "\n" in a]
        if bad:
            raise ValueError(f"the Slurm manifest cannot hold {bad[0]!r}: it holds a tab or "
                             f"newline")
    return " && ".join(shlex.join(argv) for argv in argvs)


def arrays(out):
    """The numbers N of OUT/slurm/array-N.sh, ascending."""
    scripts = (Path(out) / SLURM_DIR).glob("array-*.sh")
    numbers = [p.name[len("array-"):-len(".sh")] for p in scripts]
    return sorted(int(n) for n in numbers if n.isdigit())


def write_array(out, tasks, cpus, mem_mb, job_name="minialign", options=()):
    """Write OUT/slurm/manifest-N.tsv and OUT/slurm/array-N.sh for `tasks`; N is the newest
    array's number when it holds exactly these tasks and settings (writing the same array twice
    adds no file), else one more than the newest.
    tasks: list of (name, argvs): argvs a list of commands (each a list of str) run one after
    the other from this process's working directory, stopping at the first that fails.
    cpus: cores per task (>= 1); mem_mb: memory per task, MB (>= 1); options: more sbatch
    options, each written as one `#SBATCH` line (e.g. "--time=02:00:00", "--partition=short").
    Returns the script's path. Raises ValueError for an empty task list, or a name, argument or
    option holding a tab or newline."""
    if not tasks:
        raise ValueError("write_array: no tasks")
    lines = []
    for i, (name, argvs) in enumerate(tasks):
        if any(c in name for c in "\t\n"):
            raise ValueError(f"write_array: task name {name!r} holds a tab or newline")
        lines.append(f"{i}\t{name}\t{command_line(argvs)}\n")
    if any("\n" in o for o in options):
        raise ValueError(f"write_array: an sbatch option holds a newline: {options!r}")
    folder = (Path(out) / SLURM_DIR).resolve()
    newest = max(arrays(out), default=0)
    manifest, script = render(folder, newest or 1, lines, cpus, mem_mb, job_name, options)
    n = newest if newest and all(
        (folder / f).is_file() and (folder / f).read_bytes() == text for f, text in
        ((MANIFEST.format(newest), manifest), (SCRIPT.format(newest), script))) else newest + 1
    manifest, script = render(folder, n, lines, cpus, mem_mb, job_name, options)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(folder / MANIFEST.format(n), manifest)
    atomic_write_bytes(folder / SCRIPT.format(n), script)
    (folder / SCRIPT.format(n)).chmod(0o755)
    return folder / SCRIPT.format(n)


def render(folder, n, lines, cpus, mem_mb, job_name, options):
    """The bytes of manifest-N.tsv and array-N.sh (write_array)."""
    manifest = folder / MANIFEST.format(n)
    header = [f"--job-name={job_name}", f"--cpus-per-task={cpus}", f"--mem={mem_mb}M",
              f"--array=0-{len(lines) - 1}", f"--output={folder / 'logs'}/%A_%a.log",
              "--open-mode=append", f"--chdir={Path.cwd()}", *options]
    script = "\n".join([
        "#!/bin/sh", *(f"#SBATCH {h}" for h in header),
        f"# one task = line $SLURM_ARRAY_TASK_ID of {manifest.name} (written by minialign)",
        "set -eu",
        f"line=$(awk -F'\\t' -v i=\"$SLURM_ARRAY_TASK_ID\" '$1 == i {{print $3}}' "
        f"{shlex.quote(str(manifest))})",
        '[ -n "$line" ] || { echo "no task $SLURM_ARRAY_TASK_ID in the manifest" >&2; exit 2; }',
        'echo "minialign task $SLURM_ARRAY_TASK_ID on $(hostname): $line"',
        'eval "$line"', ""])
    return "".join(lines).encode(), script.encode()


def manifest_of(script):
    """The manifest an array-N.sh reads: manifest-N.tsv beside it."""
    script = Path(script)
    return script.with_name(MANIFEST.format(script.name[len("array-"):-len(".sh")]))


def read_manifest(path):
    """[(index, name, command)] of a manifest-N.tsv; [] when it does not exist."""
    path = Path(path)
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
        said = (ping.stdout.strip() or ping.stderr.strip() or "no answer").splitlines()[0]
        return f"the Slurm controller does not answer (scontrol ping: {said})"
    return None


def submit(script):
    """sbatch the array script; returns the job id (str). Raises OSError with sbatch's message."""
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{script}: sbatch failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def queued(out):
    """{task name: array job id} of every task of OUT/slurm's arrays that Slurm still holds
    (pending, running, requeued, held), from squeue (one line per array task, this user's
    jobs). {} where squeue is not installed. Raises OSError with squeue's message when it fails
    (e.g. the controller does not answer)."""
    if shutil.which("squeue") is None:
        return {}
    done = subprocess.run(["squeue", "--me", "--noheader", "--array", "--format=%F|%K|%o"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"squeue failed, so the runs Slurm still holds are unknown: "
                      f"{done.stderr.strip()}")
    folder, names, manifests = (Path(out) / SLURM_DIR).resolve(), {}, {}
    for line in done.stdout.splitlines():
        job_id, index, script = line.strip().split("|", 2)
        script = Path(script)
        if script.parent != folder or not index.isdigit():
            continue
        if script not in manifests:
            manifests[script] = {i: name for i, name, _ in read_manifest(manifest_of(script))}
        if int(index) in manifests[script]:
            names[manifests[script][int(index)]] = job_id
    return names


def wait(job_id, poll=0.5, timeout=None):
    """Block until job `job_id` has left the queue (polling squeue: quicker than sbatch
    --wait). Raises TimeoutError after `timeout` seconds (None: no limit)."""
    start = time.monotonic()
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True,
                         text=True).stdout.strip():
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"Slurm job {job_id} still queued after {timeout} s")
        time.sleep(poll)
