"""The data and the image side: COCO's captions and photos, the one-time DINOv2 export, the
embeddings file and the evaluation against it, and the synthetic world in the same two formats.

  coco          `make data`: COCO's captions, the 10,000-photo subset
  download      resumable, checked HTTPS downloads
  photos        the subset's photos, fetched in parallel and verified
  export        COCO photos -> DINOv2 CLS embeddings (the only module that imports torch)
  embeddings    the image-embeddings .npz format: save, load (validated), join on image id
  scoring       scores one run's saved caption embeddings against image embeddings
  evaluate      the `evaluate` command around it: locks, --rescore, the summary table
  synthetic     a SYNTHETIC world (captions + "image" embeddings) for the demo and the tests;
                v1 and v2 (synthetic_v2, calibrated by caption_stats to COCO's caption overlap)
  synthetic_v2  world v2's scenes and captions
  caption_stats the caption statistics world v2 is calibrated to

May import the core and run/. Training never imports this folder (tests/test_layering.py), so
the text model cannot see image embeddings by accident.
"""
