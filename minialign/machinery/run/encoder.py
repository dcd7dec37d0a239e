"""A finished run's encoder, from Python: its weights, and caption embeddings of any text.

    from minialign.machinery.run.encoder import embed_captions, load_model
    z = embed_captions("runs/good_views-seed0", ["a dog catches a frisbee"])     # (1, D)
"""
from pathlib import Path

from ...objectives import CAUSAL
from ...tokenizer import pad_batch
from ...train import TrainConfig
from .monitor import embed
from .rundir import CONFIG, read_finished_config, read_model


def load_model(run_dir):
    """A finished run's encoder: (params {name: float32 array}, Tokenizer, TrainConfig).
    Raises FileNotFoundError / ValueError naming the file that is missing or malformed."""
    config = read_finished_config(run_dir)
    try:
        cfg = TrainConfig(**config)
    except TypeError as err:                     # a field this version does not know
        raise ValueError(f"{Path(run_dir) / CONFIG}: not a config of this minialign "
                         f"({err})") from None
    params, tok = read_model(run_dir)
    return params, tok, cfg


def embed_captions(run_dir, captions):
    """Caption embeddings z (N, D) float32 of N caption strings, by a finished run's encoder,
    with the attention its objective trained (causal for next_token). Raw text is fine:
    Tokenizer.encode applies tokenizer.clean_caption, the cleaning the training captions had,
    so "A Dog\\u2019s bed\\n" embeds exactly like "a dog's bed". Raises TypeError if captions
    is a single str or holds a non-str, ValueError if it is empty, FileNotFoundError /
    ValueError for a run directory that is not a finished run (load_model)."""
    if isinstance(captions, str):
        raise TypeError("captions must be a list of strings, got one str (wrap it: [caption])")
    captions = list(captions)
    if not captions:
        raise ValueError("captions is empty: nothing to embed")
    params, tok, cfg = load_model(run_dir)
    tokens = pad_batch([tok.encode(c, cfg.model.max_len)[0] for c in captions])  # (N, T)
    return embed(params, tokens, cfg.model, CAUSAL[cfg.objective])
