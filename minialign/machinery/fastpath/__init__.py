"""The fast path: the fast layer set, layers.py's names and signatures over packed rows.

  fast         the fast layer set (ModelConfig.layers = "fast", the default): what model.encode
               calls instead of minialign/layers.py; tests/test_fast.py checks a whole step
  fast_layers  row layout caption by caption, attention per group of one length, pooling as a
               segment sum, cross-entropy and the tied head fused over row blocks
  fast_rows    the per-token layers (embeddings, linear, LayerNorm, GELU) as chains over row blocks
  rows         the thread pool over row blocks: the same bits for any thread count

Read minialign/layers.py first: every function here has its reference there. May import only
numpy and the core's layers (and losses through it); the model imports `fast` in one place
(model.layer_set). docs/performance.md says why each choice was made.

A student copy (docs/course.md, "What the student copy holds") has rows.py only: PRESENT is
False there, and the model runs minialign/layers.py.
"""
from pathlib import Path

PRESENT = (Path(__file__).parent / "fast.py").is_file()   # False in a student copy
