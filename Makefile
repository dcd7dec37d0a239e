# One `python -m minialign ...` command (or script) a target; `make help` lists them. LAYERS=reference
# trains layers.py; DTYPE=float64; VARIANT=sigreg|projector: the named variants of the three;
# IMAGE_EVAL=off: text side only (`make report` with the embeddings later); JOBS=N runs at once.
PY         ?= python
SUBSET     ?= coco/captions_train2017_subset10000_seed0.json
EMBEDDINGS ?= embeddings/coco_train2017_subset10000_seed0_dinov2-base.npz
VOCAB      ?= coco/bert-base-uncased-vocab.txt
SHARED     ?= ../shared
LAYERS     ?= $(if $(wildcard minialign/machinery/fast.py),fast,reference)
DTYPE      ?= float32
IMAGE_EVAL ?= on
OBJECTIVE  ?= good_views
SEED       ?= 0
DATA        = $(if $(filter-out file,$(origin SUBSET)),-$(basename $(notdir $(SUBSET))))
SUFFIX      = $(DATA)$(if $(VARIANT),-$(VARIANT))$(if $(filter reference,$(LAYERS)),-reference)$(if $(filter float64,$(DTYPE)),-float64)
OBJECTIVES  = $(foreach o,good_views bad_views next_token,$(o)$(if $(VARIANT),_$(VARIANT)))
COMMON      = --layers $(LAYERS) --dtype $(DTYPE) --objectives $(OBJECTIVES) $(if $(JOBS),--jobs $(JOBS))
IMAGES      = $(if $(filter on,$(IMAGE_EVAL)),--embeddings $(1))
HAVE        = $(if $(wildcard $(1)),$(call IMAGES,$(1)))
WORDPIECE   = --tokenizer wordpiece --vocab $(VOCAB)
# replicate-quick needs no download: the subset, else COCO val2017 captions (here or beside)
QUICK_CAPTIONS ?= $(firstword $(wildcard $(SUBSET) coco/annotations/captions_val2017.json $(SHARED)/coco/captions_val2017.json))
QUICK_VOCAB    ?= $(firstword $(wildcard $(VOCAB) $(SHARED)/tokenizers/bert-base-uncased-vocab.txt))
QUICK_CHECK     = $(if $(QUICK_CAPTIONS),,$(error no captions file: `make data`, or COCO's captions_val2017.json in coco/annotations/))
QUICK_EMB       = $(if $(filter $(SUBSET),$(QUICK_CAPTIONS)),$(EMBEDDINGS),embeddings/coco_val2017_dinov2-base.npz)
QUICK_ARGS      = $(QUICK_CHECK)--captions $(QUICK_CAPTIONS) --out results/coco-quick$(if $(filter $(SUBSET),$(QUICK_CAPTIONS)),,-val2017)$(SUFFIX) --seeds 0 \
	--steps 200 --batch-photos 128 --warmup-steps 20 --eval-every 50 --lr-per-decade 0 \
	$(if $(QUICK_VOCAB),--tokenizer wordpiece --vocab $(QUICK_VOCAB)) $(call HAVE,$(QUICK_EMB)) $(COMMON)
FULL_ARGS = --captions $(SUBSET) --out results/coco$(SUFFIX) $(WORDPIECE) $(call IMAGES,$(EMBEDDINGS)) $(COMMON)
WORLD      = results/synthetic/world
DEMO_RUNS  = --captions $(WORLD)/captions_synthetic.json --embeddings $(WORLD)/embeddings_synthetic.npz \
	--steps 500 --batch-photos 128 --warmup-steps 25 --eval-every 50 --lr 3.16e-3 --d-model 64 --n-layers 1 --n-heads 4
.PHONY: help install install-export test lines data embeddings train demo replicate eta replicate-quick eta-quick scaling report ablations bench bench-torch exercises grade

help:            ## this list
	@grep -E '^[a-z-]+:.*## ' Makefile | sed 's/:.*## /\t/' | expand -t 18
install:         ## numpy, pillow, tqdm + pytest
	$(PY) -m pip install -e '.[test]'
install-export:  ## + torch (CPU) and transformers, for the one-time DINOv2 export only
	$(PY) -m pip install torch --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install -e '.[test,export]'
test:            ## the whole suite
	$(PY) -m pytest -q
lines:           ## the tree's line counts against its budgets
	$(PY) scripts/lines.py
data:            ## one-time (internet): COCO captions, the 10,000-photo subset, BERT's vocabulary, photos
	$(PY) -m minialign data
embeddings:      ## one-time: DINOv2 embeddings of the subset's photos (make install-export first)
	$(PY) -m minialign export --captions $(SUBSET) --images coco/train2017 --out $(EMBEDDINGS)
train:           ## one run: make train OBJECTIVE=next_token SEED=1 (rerun: it resumes)
	$(PY) -m minialign train --objective $(OBJECTIVE) --seed $(SEED) --captions $(SUBSET) \
	    $(WORDPIECE) --layers $(LAYERS) --dtype $(DTYPE) --out runs/$(OBJECTIVE)-seed$(SEED)$(SUFFIX) --resume
$(WORLD)/captions_synthetic.json:
	$(PY) -m minialign synthetic --out $(WORLD)
demo: $(WORLD)/captions_synthetic.json  ## the whole protocol on a SYNTHETIC world, no download
	OPENBLAS_NUM_THREADS=1 $(PY) -m minialign replicate $(DEMO_RUNS) --lr-min 1e-3 --lr-max 1e-2 --out results/synthetic$(SUFFIX) $(COMMON)
replicate:       ## 3 objectives x 3 seeds + the lr search at the replication's size; rerun resumes
	$(PY) -m minialign replicate $(FULL_ARGS)
eta:             ## how long `make replicate` takes here; writes nothing
	$(PY) -m minialign replicate $(FULL_ARGS) --dry-run
replicate-quick: ## the classroom version: one seed, 200 steps of 128 photos, no lr search
	$(PY) -m minialign replicate $(QUICK_ARGS)
eta-quick:       ## how long `make replicate-quick` takes here; writes nothing
	$(PY) -m minialign replicate $(QUICK_ARGS) --dry-run
scaling:         ## encoder sizes x 3 objectives x 3 seeds (--dry-run: how long)
	$(PY) -m minialign scaling --captions $(SUBSET) --out results/coco-scaling$(SUFFIX) $(WORDPIECE) \
	    $(call IMAGES,$(EMBEDDINGS)) $(COMMON)
report:          ## a results directory's table and figures again: make report RESULTS=DIR [EMB=FILE]
	$(PY) -m minialign report $(RESULTS) $(if $(EMB),--embeddings $(EMB))
ablations: $(WORLD)/captions_synthetic.json  ## each named variant against the default, on the demo's protocol
	OPENBLAS_NUM_THREADS=1 $(PY) scripts/ablations.py $(DEMO_RUNS) --out results/ablations$(SUFFIX) \
	    --layers $(LAYERS) --dtype $(DTYPE) $(if $(JOBS),--jobs $(JOBS))
bench:           ## ms per step of each objective, fast and reference layer sets, against numpy's sgemm peak
	$(PY) benchmarks/bench.py $(if $(QUICK_CAPTIONS),--captions $(QUICK_CAPTIONS))
bench-torch:     ## the same step beside PyTorch eager, A B A B (pip install torch first)
	$(PY) benchmarks/torch_step.py $(if $(QUICK_CAPTIONS),--captions $(QUICK_CAPTIONS))
exercises:       ## the student copy: make exercises OUT=../course [SOLVED="1 2"]
	$(PY) -m minialign exercises $(OUT) $(if $(SOLVED),--solved $(SOLVED))
grade:           ## check this copy's exercises with its tests, one row each: make grade [N="4 5"]
	$(PY) -m pytest -q --tb=no -rN tests/test_exercises.py $(if $(N),-m "$(N:%=exercise% or) False") || [ $$? -eq 1 ]
