"""The report's context rows beside chance: what an UNTRAINED encoder scores, and on a
synthetic world the world's own ceiling. `report` computes them once per results directory
and keeps them in OUT/baselines.json; a rerun with the same captions, model, seeds and image
embeddings reads them back, so the numbers stay put.

    untrained   each seed's encoder at initialisation, step 0: model.init_params drawn from the
                seed's first stream, exactly as train.run draws it, so it is the encoder that
                seed's runs start from. Scored like a finished run's test split: the test
                captions embedded (monitor.embed, rounded through float16 as runs save them),
                then evaluate.evaluate_split: mutual-kNN@10 and caption -> image R@k after a
                rotation fitted on the train photos' slot-0 captions, with image embeddings;
                paraphrase R@1 always. One score per attention the protocol trains with:
                "bidirectional" (good_views, bad_views) and "causal" (next_token). It says how
                much of a score the architecture gives before any training (random features of
                a caption's words and their order).
    ceiling     synthetic.world_ceiling_of_files: mutual-kNN@10 between the world's scene
                factors and its image embeddings on the test photos, what an encoder that
                recovered every scene exactly would score. None for COCO (no factors).
"""
import dataclasses
import json
from pathlib import Path

import numpy as np

from ...model import init_params
from ...objectives import CAUSAL
from ..images.embeddings import load_embeddings, sha256_file
from ..images.evaluate import RECALL_KS, evaluate_split
from ..run.files import atomic_write_json, read_json
from ..run.monitor import EVAL_SLOTS, embed, eval_tokens, prepare
from .protocol import run_config
from ..images.synthetic import world_ceiling_of_files

BASELINES = "baselines.json"                             # in the results directory
ATTENTION = {False: "bidirectional", True: "causal"}     # objectives.CAUSAL -> its name
IMAGE_KEYS = ("mutual_knn", *(f"R@{k}" for k in RECALL_KS))


def saved_slots(params, table, image_ids, model, causal, n_slots):
    """A split's captions as a run saves and evaluate reads them: [(image ids (P_s,) int64,
    z (P_s, D) float32 rounded through float16)] for slots s = 0 .. n_slots - 1.
    table: data.CaptionTable; image_ids: (P,) the captions file's ids (table.photo_idx rows)."""
    slots = []
    for s in range(n_slots):
        tokens, photos = eval_tokens(table, s)                            # (P_s, T), (P_s,)
        z = embed(params, tokens, model, causal)                          # (P_s, D) float32
        slots.append((image_ids[table.photo_idx[photos]],
                      z.astype(np.float16).astype(np.float32)))           # (P_s,), (P_s, D)
    return slots


def untrained_test(cfg, data, emb, causal):
    """Test metrics of the encoder a run of cfg.seed starts from. cfg: TrainConfig whose model
    has the vocabulary's size; data: monitor.prepare(cfg); emb: ImageEmbeddings or None;
    causal: the attention to encode with. Returns {"paraphrase_R@1" [, "mutual_knn", "R@1",
    "R@5", "R@10": means over caption slots, with emb]}."""
    rng_init = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(3)[0])  # train.run's
    params = init_params(cfg.model, rng_init)
    ids, test = data["captions"].image_ids, data["tables"]["test"]
    test_slots = saved_slots(params, test, ids, cfg.model, causal,
                             min(EVAL_SLOTS, int(test.counts.max())))
    train_slots = None if emb is None else saved_slots(params, data["tables"]["train"], ids,
                                                       cfg.model, causal, 1)
    scored = evaluate_split(test_slots, emb, train_slots, f"untrained encoder, seed {cfg.seed}")
    out = {"paraphrase_R@1": scored["text"]["paraphrase_R@1"]}
    if emb is not None:
        out.update({key: scored[key]["mean"] for key in IMAGE_KEYS})
    return out


def untrained_scores(protocol, emb, size=None):
    """{attention: {"objectives": those trained with it, "seeds": protocol.seeds, "test": one
    untrained_test dict per seed}} for each attention among protocol.objectives.
    emb: ImageEmbeddings or None (paraphrase R@1 only); size: (D, L) of a scaling sweep."""
    cfg = run_config(protocol, protocol.objectives[0], protocol.seeds[0], size=size)
    data = prepare(cfg)                     # captions, split, tokenizer: shared by every run
    model = dataclasses.replace(cfg.model, vocab_size=data["tokenizer"].vocab_size)
    out = {}
    for objective in protocol.objectives:
        entry = out.setdefault(ATTENTION[CAUSAL[objective]], {"objectives": []})
        entry["objectives"].append(objective)
    for attention, entry in out.items():
        entry["seeds"] = list(protocol.seeds)
        entry["test"] = [untrained_test(dataclasses.replace(cfg, seed=seed, model=model), data,
                                        emb, attention == "causal") for seed in protocol.seeds]
    return out


def baselines_key(protocol, embeddings, size=None):
    """What the saved numbers depend on: captions, split, vocabulary, model (the size's for a
    sweep), seeds, objectives and the image embeddings' sha256 (None: text side only)."""
    base = protocol.base
    model = (base if size is None else run_config(protocol, protocol.objectives[0],
                                                  protocol.seeds[0], size=size)).model
    key = {"captions": base.captions, "split_seed": base.split_seed, "min_count": base.min_count,
           "model": dataclasses.asdict(model), "seeds": list(protocol.seeds),
           "objectives": list(protocol.objectives),
           "embeddings_sha256": embeddings["sha256"] if embeddings else None}
    return json.loads(json.dumps(key))                    # as it reads back from the file


def baselines_path(out, size=None):
    """out/baselines.json; a sweep's size (D, L): out/baselines-d{D}-l{L}.json."""
    return Path(out) / (BASELINES if size is None else f"baselines-d{size[0]}-l{size[1]}.json")


def load_baselines(out, protocol, embeddings=None, size=None):
    """The context rows of the results directory `out` (size: of one size (D, L) of a sweep):
    baselines_path(out, size) if it was made for the same baselines_key, else computed now
    (untrained_scores, and world_ceiling_of_files for a synthetic world) and written there. embeddings: {"path", "sha256"} of the image
    embeddings the runs were scored against, or None. Returns {"key", "untrained": {...} or
    None, "ceiling": float or None, "world": the synthetic world's version or None (absent in
    a baselines.json from before #22)}; untrained is None when the captions file is gone (the
    report then shows "-"). Raises ValueError (one line naming the file) for a damaged
    baselines.json or embeddings file."""
    path, key = baselines_path(out, size), baselines_key(protocol, embeddings, size)
    if path.is_file():
        saved = read_json(path, "untrained-encoder and ceiling scores (baselines.json)")
        if saved.get("key") == key and ("world" in saved or saved.get("ceiling") is None):
            return saved                         # (a synthetic one from before #22: redone)
    captions = protocol.base.captions
    if not Path(captions).is_file():
        return {"key": key, "untrained": None, "ceiling": None}
    emb = ceiling = world = None
    if embeddings and Path(embeddings["path"]).is_file() \
            and sha256_file(embeddings["path"]) == embeddings["sha256"]:
        emb = load_embeddings(embeddings["path"])
        if emb.meta.get("synthetic"):
            ceiling = world_ceiling_of_files(captions, embeddings["path"],
                                             split_seed=protocol.base.split_seed)
            world = emb.meta.get("world", "v1")            # files from before #22: v1
    result = {"key": key if emb is not None or not embeddings else {**key,
                                                                    "embeddings_sha256": None},
              "untrained": untrained_scores(protocol, emb, size), "ceiling": ceiling,
              "world": world}
    atomic_write_json(path, result)
    return result
