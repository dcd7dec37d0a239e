"""The experiment: what a grid is, and what it reports.

  protocol        the grid (objectives x seeds x sizes), run names, protocol.json, the lr search
  scaling         the sweep's sizes, parameter counts and the gap's trend
  baselines       the untrained-encoder and world-ceiling rows
  speed           "aligns faster": steps to a target, area under the validation curve
  figures         the PNG figures (Pillow only)
  report          results.md, results.json and the figures from saved runs
  results_md      the text of results.md
  rescore         stale image scores scored again; one embeddings file per table
  compare         two results directories side by side (VICReg vs SIGReg)
  agreement       a table against the repository's demo, within the seeds' spread; the docs' table
  scaling_report  a sweep's results.md and fig_scaling.png

May import the core, run/ and images/ (to score runs and the baselines).
"""
