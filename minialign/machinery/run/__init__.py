"""One training run: its flags, the machine it runs on, its directory and files, its checkpoint,
what it evaluates and prints, and its finished encoder.

  files        the one atomic writer, one-line-error readers of every file minialign writes
  dirlock      one process at a time per run (or results) directory, with the platform's lock
  runlock      one writer per run: the run's lock held (or waited for) around a rewrite
  blasenv      one BLAS thread for Accelerate, MKL and BLIS, set before numpy loads
  machine      describes the machine (numpy, BLAS, threads, CPU) and sets the cores a run uses
  flags        command-line value types with their ranges; each training flag declared once
  rundir       a run directory: every file name, config/metrics/captions/model reads and writes
  scores       what a run's image scores were computed with (embeddings, checkpoint); stale ones
  checkpoint   checkpoint.npz, resuming whatever stage stopped, --force replacing only a run
  monitor      what train.run does around its step: inputs read and checked, evaluations, progress
  encoder      a finished run's encoder from Python: load_model, embed_captions

May import numpy, tqdm, the core and fastpath/. train imports rundir, checkpoint, files and
monitor to write its run (they import only the core below train); encoder reads a finished run.
"""
