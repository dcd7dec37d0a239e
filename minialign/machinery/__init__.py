"""The machinery around the core (minialign/*.py): what runs, stores and measures training.

  the command line  cli (sub-commands), flags (value types; each training flag once)
  a run directory   rundir (file names, reads, writes), checkpoint (resume, --force), files
                    (atomic writes, readers, lock), monitor (what a run evaluates and
                    prints), encoder
  the fast path     fast_layers: packed, length-grouped attention; layers.mha_forward is its
                    readable reference
  image side        embeddings (.npz format), export (DINOv2, optional torch), evaluate
  replication       protocol (grid, lr search), replicate, report + figures, synthetic
  data and speed    coco + download + photos (`make data`), bench + machine
"""
