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

install-export:     ## + torch (CPU build, ~190 MB) and transformers, for the one-time DINOv2 export only
	$(PY) -m pip install torch --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install -e '.[test,export]'

test:
	$(PY) -m pytest -q

train:              ## make train OBJECTIVE=next_token STEPS=1000 SEED=1
	$(PY) -m minialign train --objective $(OBJECTIVE) --captions $(CAPTIONS) \
	    --steps $(STEPS) --seed $(SEED) --out $(RUN)

bench:
	$(PY) -m minialign bench

# ---- the replication: minialign/replicate.py (runs) and minialign/report.py (table, figures).
# Every target can be stopped (Ctrl-C) and rerun: finished runs are skipped, the run in
# progress resumes from its last checkpoint (every 250 steps; 50 in replicate-quick).
RESULTS    ?= results/coco
QUICK      ?= results/coco-quick
DEMO       ?= results/synthetic
DEMO_WORLD ?= $(DEMO)/world

replicate:          ## 3 objectives x seeds 0-2, 3000 steps x 256 photos, lr 1e-3 + per-objective lr search
	$(PY) -m minialign replicate --captions $(CAPTIONS) --embeddings $(EMBEDDINGS) \
	    --image-eval $(IMAGE_EVAL) --out $(RESULTS)

# The classroom version, sized for ~11 min on 2 cores: one seed, no lr search, 200 steps of
# 128 photos (a default-size step of 128 photos: ~0.65 s good/bad views, ~1.25 s next token)
replicate-quick:    ## one seed, 200 steps x 128 photos, no lr search: same table shape
	$(PY) -m minialign replicate --captions $(CAPTIONS) --embeddings $(EMBEDDINGS) \
	    --image-eval $(IMAGE_EVAL) --out $(QUICK) --seeds 0 --steps 200 --batch-photos 128 \
	    --warmup-steps 20 --eval-every 50 --lr-search off

# The grid on a SYNTHETIC world (no COCO needed): D=32, 1 block, 120 steps x 64 photos, with
# an lr search over 1e-3..1e-2. Its matrices are tiny, so one BLAS thread is the fastest.
demo: $(DEMO_WORLD)/captions_synthetic.json  ## 3 objectives x seeds 0-2 + lr search, synthetic, ~3 min
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m minialign replicate \
	    --captions $(DEMO_WORLD)/captions_synthetic.json \
	    --embeddings $(DEMO_WORLD)/embeddings_synthetic.npz --out $(DEMO) \
	    --steps 120 --batch-photos 64 --warmup-steps 10 --eval-every 20 --lr 3.16e-3 \
	    --lr-min 1e-3 --lr-max 1e-2 --d-model 32 --n-layers 1 --n-heads 4

$(DEMO_WORLD)/captions_synthetic.json:
	$(PY) -m minialign synthetic --out $(DEMO_WORLD)

report:             ## rebuild results.md, results.json and the figures: make report RESULTS=results/synthetic
	$(PY) -m minialign report $(RESULTS)
