"""The machinery around the core: what runs, stores and measures the training in
minialign/*.py, which a reader can skip on a first pass.

    cli          the command line: every sub-command, its flags, exit codes
    flags        argparse value types with their ranges; the training flags, declared once
    rundir       a run directory's files: names, config, metrics, captions, model, divergence
    checkpoint   checkpoint.npz, resuming a stopped run, --force replacing one
    files        the one atomic writer, one-line-error readers, the directory lock
    fast_layers  the packed, length-grouped attention path the model runs (layers.py's
                 mha_forward is its readable reference)
    encoder      a finished run's encoder from Python: load_model, embed_captions
    embeddings   the image-embeddings .npz: save, load (validated), join on image id
    export       one-time COCO images -> DINOv2 embeddings (optional torch)
    evaluate     saved caption embeddings x image embeddings: mutual kNN, R@k
    synthetic    a small SYNTHETIC world in the same file formats
    protocol     the replication grid, run names, protocol.json, the lr search
    replicate    the grid run end to end, resumable
    report       results.md / results.json from saved runs; figures draws its PNGs
    bench        ms/step against numpy's GEMM peak; machine describes the machine
    coco         the COCO captions and the 10,000-photo subset; download fetches files
"""
