"""Running a grid of runs: locally, N at once, with its time estimate, or on Slurm.

  replicate    the whole protocol as one command that survives being stopped
  scored       the grid's image embeddings checked before training; runs still to score
  jobs         N runs at once in their own processes, cores that follow the runs
  memory       one run's memory, the machine's, and how many runs fit (--jobs)
  estimate     the time a grid will take, measured before committing a night (--dry-run)
  slurm        a Slurm job array written, submitted, watched
  slurm_runs   the grid's runs as the array's tasks (--slurm)
  scaling_run  `python -m minialign scaling`: the sweep on replicate's machinery

May import the core and every other folder of machinery/ but cli.py (docs/grid.md, docs/slurm.md).
"""
