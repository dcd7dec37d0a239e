"""The machinery around the core (minialign/*.py): what runs, stores and measures training.

  the command line  cli (sub-commands), flags (value types; each training flag once)
  a run directory   rundir (file names, reads, writes), checkpoint (resume, --force), files
                    (atomic writes, readers), dirlock (one process per directory, with each
                    platform's lock), monitor (inputs read and checked, what a run evaluates
                    and prints), encoder
  the fast path     fast (the fast layer set: layers.py's names, ModelConfig.layers = "fast"),
                    fast_layers (row layout, attention per group of one length, pooling,
                    cross-entropy), fast_rows (per-token layers over row blocks), rows (the
                    thread pool over row blocks); layers.py is their readable reference
  image side        embeddings (.npz format), export (DINOv2, optional torch), evaluate
  replication       protocol (grid, lr search), replicate, jobs (runs in parallel), estimate
                    (the time a grid will take), slurm + slurm_runs (job arrays, the runs as
                    tasks), report + figures + speed ("aligns faster") + baselines (untrained,
                    ceiling) + compare (two directories side by side), synthetic (worlds v1,
                    v2 = synthetic_v2, calibrated by caption_stats to COCO's caption overlap)
  scaling sweep     scaling (sizes, parameters, the gap's trend), scaling_run (the command),
                    scaling_report (results.md, fig_scaling)
  data and speed    coco + download + photos (`make data`), bench + gemms + bench_torch +
                    machine + blasenv (BLAS threads, set before numpy loads)
  the course kit    exercises (the marked bodies, the student copy), grade (each exercise's
                    tests, one row each); docs/course.md is the lesson plan
"""
