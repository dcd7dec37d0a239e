"""Benchmarks: how fast a training step is (docs/performance.md).

  bench        ms/step of each objective on both layer sets, fraction of numpy's GEMM peak,
               non-GEMM share, peak memory (`make bench`)
  bench_torch  side by side with PyTorch eager, benchmarks/torch_step.py (`make bench-torch`)
  gemms        every matrix product of a step, counted and replayed alone

May import the core, fastpath/ and run/. grid/estimate times steps with bench.
"""
