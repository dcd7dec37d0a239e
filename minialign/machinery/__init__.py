"""Everything around the lesson (minialign/*.py), one module per part: fast (the fast layer
set), variants (named experiments beside the three objectives), runs (a run's files and the
lock), grid (replicate, the lr search, scaling, Slurm), images (scores from saved caption
embeddings), report and figures, coco (make data), export (DINOv2), synthetic (the demo's
world), course (exercises and grading) and cli (the command line)."""
