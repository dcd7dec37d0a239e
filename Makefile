# minialign: every target is one documented python -m minialign command; see README.md.
PY         ?= python
SHARED     ?= ../shared/coco
CAPTIONS   ?= $(SHARED)/captions_val2017.json
EMBEDDINGS ?= embeddings/coco_val2017_dinov2-base.npz
IMAGE_EVAL ?= on
OBJECTIVE  ?= good_views
STEPS      ?= 3000
SEED       ?= 0
RUN        ?= runs/$(OBJECTIVE)-seed$(SEED)

.PHONY: install install-export test train bench embeddings demo replicate replicate-quick report

install:            ## numpy, pillow, tqdm + pytest
	$(PY) -m pip install -e '.[test]'

install-export:     ## + torch (CPU) and transformers, for the one-time DINOv2 export only
	$(PY) -m pip install -e '.[test,export]'

test:
	$(PY) -m pytest -q

train:              ## make train OBJECTIVE=next_token STEPS=1000 SEED=1
	$(PY) -m minialign train --objective $(OBJECTIVE) --captions $(CAPTIONS) \
	    --steps $(STEPS) --seed $(SEED) --out $(RUN)

bench:
	$(PY) -m minialign bench
