"""What an encoder learned: held-out R^2 of each unit test caption embedding (float64) predicted
by ridge regression from (a) a one-hot of the caption's token count, (b) its bag of words, each
token's share of those between BOS and EOS (the content, not the length), (c) the same for its
first two words, (d) another caption of the photo (slot 1 -> slot 0). R^2 = 1 - SSE / SST over
all dimensions, cross-fitted on two halves of the photos (a permutation from default_rng(seed)),
at the best of 7 PENALTIES. Meaning scores on (b) and (d); a length shortcut on (a) alone, an
opening shortcut on (c). Rows: the untrained encoders (step 0 of each seed) and the seed grid."""
from pathlib import Path

import numpy as np

from ..data import load_captions
from ..objectives import CAUSAL
from . import grid, images, runs

PENALTIES = 10.0 ** np.arange(-4, 3)
MEASURES = ("length", "words", "opening", "paraphrase")
unit = lambda z: z.astype(np.float64) / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def folds(x, half):
    """Per half f: (f, x[f] in the basis of the SVD of the other half's centred x, U, S)."""
    out = []
    for f in (half, ~half):
        u, s, vt = np.linalg.svd(x[~f] - x[~f].mean(0), full_matrices=False)
        out.append((f, (x[f] - x[~f].mean(0)) @ vt.T, u, s))
    return out


def r2(fits, y):
    """Held-out R^2 of ridge regressions y (N, D) ~ x, fits = folds(x, half), best penalty."""
    sse = np.zeros(len(PENALTIES))
    for f, xs, u, s in fits:
        my, uy = y[~f].mean(0), u.T @ (y[~f] - y[~f].mean(0))               # (D,), (r, D)
        sse += [((y[f] - my - (xs * (s / (s * s + c))) @ uy) ** 2).sum() for c in PENALTIES]
    return float(1 - sse.min() / ((y - y.mean(0)) ** 2).sum())


def features(tokens):
    """Token id arrays [BOS, ..., EOS] -> one-hot of the count, bag of words, of the first two."""
    n, vocab = np.array([len(t) for t in tokens]), np.unique(np.concatenate(tokens))
    bags = np.zeros((2, len(tokens), len(vocab)))
    for i, t in enumerate(tokens):
        for bag, w in zip(bags, (t[1:-1], t[1:-1][:2])):
            np.add.at(bag[i], np.searchsorted(vocab, w), 1.0 / max(len(w), 1))
    return [(n[:, None] == np.unique(n)).astype(np.float64), *bags]


def measure(path, captions, tok, max_len, memo, seed=0):
    """{measure: held-out R^2} of one saved caption file; memo keeps the captions' folds."""
    slots = runs.load_caption_slots(path)
    ids = np.concatenate([i for i, _ in slots])
    photos = np.random.default_rng(seed).permutation(np.unique(ids))[:len(np.unique(ids)) // 2]
    if (key := (ids.tobytes(), seed)) not in memo:
        rows = [(p, s) for s, (i, _) in enumerate(slots) for p in
                np.searchsorted(captions.image_ids, i)]
        memo[key] = [folds(x, np.isin(ids, photos)) for x in features(
            [tok.encode(captions.captions[p][s], max_len)[0] for p, s in rows])]
    (ids0, z0), (ids1, z1) = slots[:2]
    z1 = unit(z1[images.positions(ids1, ids0)])                         # slot 1 of each photo
    z = unit(np.concatenate([z for _, z in slots]))
    return dict(zip(MEASURES, [r2(fits, z) for fits in memo[key]] + [
        r2(folds(z1, np.isin(ids0, photos)), unit(z0))]))


def diagnose(results_dir, seed=0):
    """[{"row", "seeds", measure: [per seed]}]: each seed's untrained encoder, bidirectional and
    causal, then each objective at the protocol's lr, on the test split; [] until a run ends."""
    out = Path(results_dir)
    protocol, rows = runs.read_json(out / "protocol.json"), {}
    lr, order = protocol["base"]["lr"], protocol["objectives"]     # rows: the table's order
    done = [(d, cfg) for d in sorted((out / "runs").glob("*")) if grid.state(d) == "finished"
            and (cfg := runs.read_config(d)).lr == lr]
    if done:
        captions, tok, memo = (load_captions(done[0][1].captions),
                               runs.load_model(done[0][0])[2], {})
    for d, cfg in done:
        files = runs.caption_files(d, "test")
        untrained = "untrained, " + ("causal" if CAUSAL[cfg.objective] else "bidirectional")
        for row, step in ((untrained, 0), (cfg.objective, max(files))):
            if step in files and cfg.seed not in rows.setdefault(row, {}):
                rows[row][cfg.seed] = measure(files[step], captions, tok, cfg.model.max_len,
                                              memo, seed)
    first = lambda r: (r[:9] != "untrained", r in order and order.index(r))   # noqa: E731
    return [{"row": r, "seeds": sorted(rows[r]), **{m: [rows[r][s][m] for s in sorted(rows[r])]
            for m in MEASURES}} for r in sorted(rows, key=first)]
