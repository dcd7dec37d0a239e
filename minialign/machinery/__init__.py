"""The machinery around the core (minialign/*.py): what runs, stores and measures training,
in folders named for what they are (docs/architecture.md has the map):

  fastpath/    the fast layer set (the default) over packed rows; layers.py is its reference
  run/         one training run: flags, machine, run directory, files and lock, checkpoint,
               what it evaluates and prints, the finished encoder
  course/      the course kit: the exercises and the grader (docs/course.md)
  images/      COCO captions and photos, the DINOv2 export, the embeddings file, evaluation
               against it, the synthetic world
  timing/      the benchmarks: bench, bench_torch, gemms
  experiment/  what a grid is (protocol, scaling sizes) and what it reports (report, figures,
               baselines, speed, compare, scaling_report)
  grid/        running a grid: replicate, jobs, estimate, slurm, slurm_runs, scaling_run
  grading.py   `grade`'s command line, which __main__ runs without cli.py (a student copy's
               own files may not import)
  cli.py       the command line, every sub-command; imports all of the above

Imports point one way, down, folder by folder (tests/test_layering.py): fastpath < run, course
< images, timing < experiment < grid < grading.py < cli.py, and the machinery above the core, but for the
two places the core reaches in (model -> fastpath.fast, absent in a student copy; train -> run's run-directory helpers).
"""
