# minialign: every target is one documented python -m minialign command; see README.md.
PY         ?= python
# The replication's photos: ONE subset file (`make data`) that training, evaluation and the
# DINOv2 export (`make embeddings`) all read, so every test photo has its image embedding.
SUBSET     ?= coco/captions_train2017_subset10000_seed0.json
CAPTIONS   ?= $(SUBSET)
EMBEDDINGS ?= embeddings/coco_train2017_subset10000_seed0_dinov2-base.npz
SHARED     ?= ../shared/coco
IMAGE_EVAL ?= on
OBJECTIVE  ?= good_views
STEPS      ?= 3000
SEED       ?= 0
# LAYERS=reference: train on minialign/layers.py, the readable layer set (slower, same maths
# within float rounding); fast (default): machinery/fastpath/fast.py. Every target that trains takes it,
# and writes into a directory whose name ends in -reference. A student copy has no fast path:
# reference is its default (docs/course.md, "What the student copy holds").
LAYERS     ?= $(if $(wildcard minialign/machinery/fastpath/fast.py),fast,reference)
# DTYPE=float64: train in float64, whose rounding is too small for training to carry into the
# results (docs/protocol.md, "Results that do not depend on rounding"; slower); every target
# that trains takes it, into a directory whose name ends in -float64.
DTYPE      ?= float32
LAYERS_SUFFIX = $(if $(filter reference,$(LAYERS)),-reference)$(if $(filter float64,$(DTYPE)),-float64)
RUN        ?= runs/$(OBJECTIVE)-seed$(SEED)$(LAYERS_SUFFIX)
# The tokenizer of the runs on real captions (train, replicate, eta): wordpiece, BERT's uncased
# vocabulary (30,522 entries: the replication's 10,989,568-parameter encoder; `make data`
# downloads it to VOCAB), or TOKENIZER=words (a vocabulary of the training captions' words,
# 4.66M parameters on the subset; results under a name ending in -words). The demo and the
# synthetic world keep words: their ~100-word vocabulary is the world's (docs/architecture.md).
TOKENIZER  ?= wordpiece
VOCAB      ?= coco/bert-base-uncased-vocab.txt
TOKENIZER_FLAGS = --tokenizer $(TOKENIZER) $(if $(filter wordpiece,$(TOKENIZER)),--vocab $(VOCAB))
TOK_SUFFIX = $(if $(filter words,$(TOKENIZER)),-words)
CHECK_VOCAB = @test "$(TOKENIZER)" != wordpiece || test -f "$(VOCAB)" || { echo '$(VOCAB): no \
	such file; `make data` downloads BERT'"'"'s vocabulary, or pass TOKENIZER=words' >&2; exit 2; }

.PHONY: install install-export test test-oldest data embeddings train bench bench-torch demo demo-compare replicate replicate-quick ablations \
        eta eta-quick report scaling eta-scaling scaling-demo exercises grade

install:            ## numpy, pillow, tqdm + pytest
	$(PY) -m pip install -e '.[test]'

install-export:     ## + torch (CPU build, ~190 MB) and transformers, for the one-time DINOv2 export only
	$(PY) -m pip install torch --index-url https://download.pytorch.org/whl/cpu
	$(PY) -m pip install -e '.[test,export]'

test:
	$(PY) -m pytest -q

# The suite on the oldest numpy, Pillow, tqdm and pytest that pyproject.toml allows and this
# Python has wheels of (numpy 1.24 has none past 3.11, Pillow 9.0 none past 3.10), in a new
# venv under /tmp that imports this checkout's package (docs/platforms.md).
OLDEST_VENV ?= /tmp/minialign-oldest
OLDEST      ?= $(shell $(PY) -c 'import sys; print({(3, 10): "numpy==1.24.4 pillow==9.0.0", \
	(3, 11): "numpy==1.24.4 pillow==9.3.0", (3, 12): "numpy==1.26.2 pillow==10.1.0", \
	(3, 13): "numpy==2.1.0 pillow==11.0.0"}.get(sys.version_info[:2], "numpy pillow"))')
test-oldest:        ## python -m pytest -q under the oldest supported numpy, in a temporary venv
	$(PY) -m venv --clear $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q --disable-pip-version-check $(OLDEST) \
	    tqdm==4.60.0 pytest==7.0.0
	$(OLDEST_VENV)/bin/python -c 'import numpy, PIL, tqdm, pytest; print("oldest:", "numpy", \
	    numpy.__version__, "pillow", PIL.__version__, "tqdm", tqdm.__version__, "pytest", \
	    pytest.__version__)'
	$(OLDEST_VENV)/bin/python -m pytest -q

# one line, exit 2, when the captions file is missing: which make command creates it
CHECK_CAPTIONS = @test -f "$(CAPTIONS)" || { echo '$(CAPTIONS): no such file; `make data` \
	downloads the COCO captions and writes $(SUBSET), or pass CAPTIONS=path/to/captions_val2017.json (COCO'"'"'s own val2017 captions work)' >&2; exit 2; }

data:               ## one-time (internet): COCO captions, the 10,000-photo subset, BERT's vocabulary, the photos -> coco/
	$(PY) -m minialign data

embeddings: $(EMBEDDINGS)  ## one-time: DINOv2 embeddings of the subset's photos (make install-export first)

$(EMBEDDINGS): | $(SUBSET)
	$(PY) -m minialign export --captions $(SUBSET) --images coco/train2017 --out $(EMBEDDINGS)

$(SUBSET):
	$(PY) -m minialign data

# RESUME=1 continues an interrupted run from its last checkpoint; FORCE=1 starts RUN over.
RESUME     ?=
FORCE      ?=
train:              ## make train OBJECTIVE=next_token STEPS=1000 SEED=1 [RESUME=1 | FORCE=1]
	$(CHECK_CAPTIONS)
	$(CHECK_VOCAB)
	$(PY) -m minialign train --objective $(OBJECTIVE) --captions $(CAPTIONS) \
	    --steps $(STEPS) --seed $(SEED) --layers $(LAYERS) --dtype $(DTYPE) $(TOKENIZER_FLAGS) --out $(RUN) \
	    $(if $(RESUME),--resume) $(if $(FORCE),--force)

# bench and bench-torch time a real COCO batch: the first captions file replicate-quick finds
BENCH_CAPTIONS = $(if $(QUICK_CAPTIONS),--captions $(QUICK_CAPTIONS))
bench:              ## ms/step of each objective, on the fast and on the reference layer set
	$(PY) -m minialign bench $(BENCH_CAPTIONS)

bench-torch:        ## minialign vs PyTorch eager (benchmarks/torch_step.py) on the same batch, A B A B; needs the [bench] extra
	$(PY) -m minialign.machinery.timing.bench_torch --pairs 3 --max-len 16 $(BENCH_CAPTIONS)

# ---- the replication: minialign/machinery/grid/replicate.py (runs) and minialign/machinery/experiment/report.py (table, figures).
# Every target can be stopped (Ctrl-C) and rerun: finished runs are skipped, the run in
# progress resumes from its last checkpoint (every 250 steps; 50 in replicate-quick, 10 in demo).
# ANTICOLLAPSE=sigreg: every objective with LeJEPA's SIGReg in place of VICReg's variance +
# covariance (--anticollapse), into its own results directory (the name ends in -sigreg).
ANTICOLLAPSE ?= vicreg
AC_SUFFIX   = $(if $(filter sigreg,$(ANTICOLLAPSE)),-sigreg)$(LAYERS_SUFFIX)  # and -reference, -float64
RESULTS    ?= results/coco$(TOK_SUFFIX)$(AC_SUFFIX)
QUICK      ?= results/coco-quick$(QUICK_TOK_SUFFIX)$(AC_SUFFIX)
DEMO       ?= results/synthetic$(AC_SUFFIX)
DEMO_WORLD ?= results/synthetic/world-v2

# JOBS=N: runs at once, each in its own process on its share of the cores (its row pool; BLAS
# on one thread; empty: one run per core, as many as fit in memory). THREADS=T: cores per run
# (--threads T; with JOBS=1, T cores for the one run). `make replicate` prints how long it will take first (a ~1 min
# timing); `make eta` / `make eta-quick` print only that, with the same flags, write nothing.
JOBS       ?=
THREADS    ?=
JOBS_FLAG   = $(if $(JOBS),--jobs $(JOBS)) $(if $(THREADS),--threads $(THREADS))
REPLICATE_ARGS = --captions $(CAPTIONS) --embeddings $(EMBEDDINGS) --image-eval $(IMAGE_EVAL) \
	--out $(RESULTS) --anticollapse $(ANTICOLLAPSE) --layers $(LAYERS) --dtype $(DTYPE) $(TOKENIZER_FLAGS) \
	$(JOBS_FLAG)

replicate:          ## 3 objectives x seeds 0-2, 3000 steps x 256 photos, lr 1e-3 + per-objective lr search
	$(CHECK_CAPTIONS)
	$(CHECK_VOCAB)
	$(PY) -m minialign replicate $(REPLICATE_ARGS)

eta:                ## how long `make replicate` (same JOBS, IMAGE_EVAL) will take here; writes nothing
	$(CHECK_CAPTIONS)
	$(CHECK_VOCAB)
	$(PY) -m minialign replicate $(REPLICATE_ARGS) --dry-run

# The classroom version, 18-20 min measured on a busy 2-core machine (~5 min on a fast one;
# make eta-quick says for yours; docs/performance.md): one seed, no lr search, 200 steps of
# 128 photos (a default-size step of 128 photos: ~0.65 s good/bad views, ~1.25 s next token).
# No download needed: the first captions file that exists of the subset, your COCO val2017
# captions, and the development machine's copy beside the checkout (SHARED, optional: a clone
# has none and needs none); embeddings to match.
QUICK_CAPTIONS   ?= $(firstword $(wildcard $(SUBSET) coco/annotations/captions_val2017.json \
                                          $(SHARED)/captions_val2017.json))
QUICK_EMBEDDINGS ?= $(strip $(if $(filter $(SUBSET),$(QUICK_CAPTIONS)),$(EMBEDDINGS),\
                        embeddings/coco_val2017_dinov2-base.npz))
CHECK_QUICK = @test -n "$(QUICK_CAPTIONS)" || { echo 'no captions file: none of $(SUBSET), \
	coco/annotations/captions_val2017.json, $(SHARED)/captions_val2017.json exists; \
	`make data` creates one' >&2; exit 2; }
# The tokenizer: replicate's (TOKENIZER) when its vocabulary is here (VOCAB, or the development
# machine's copy beside the checkout), else words, said in one line.
QUICK_VOCAB ?= $(if $(filter wordpiece,$(TOKENIZER)),$(firstword $(wildcard $(VOCAB) \
                   $(SHARED)/../tokenizers/bert-base-uncased-vocab.txt)))
QUICK_TOK_SUFFIX = $(if $(QUICK_VOCAB),,-words)
NOTE_QUICK_VOCAB = @test -n "$(QUICK_VOCAB)" || echo 'replicate-quick: the word tokenizer \
	($(if $(filter words,$(TOKENIZER)),TOKENIZER=words,no $(VOCAB): `make data` downloads it)), \
	so not the replication'"'"'s 10,989,568-parameter encoder' >&2
QUICK_ARGS = --captions $(QUICK_CAPTIONS) --embeddings $(QUICK_EMBEDDINGS) \
	--image-eval $(IMAGE_EVAL) --out $(QUICK) --seeds 0 --steps 200 --batch-photos 128 \
	--warmup-steps 20 --eval-every 50 --lr-search off --anticollapse $(ANTICOLLAPSE) \
	--layers $(LAYERS) --dtype $(DTYPE) $(if $(QUICK_VOCAB),--tokenizer wordpiece --vocab $(QUICK_VOCAB)) \
	$(JOBS_FLAG)
replicate-quick:    ## one seed, 200 steps x 128 photos, no lr search: same table shape
	$(CHECK_QUICK)
	$(NOTE_QUICK_VOCAB)
	$(PY) -m minialign replicate $(QUICK_ARGS) --no-estimate

eta-quick:          ## how long `make replicate-quick` will take here; writes nothing
	$(CHECK_QUICK)
	$(NOTE_QUICK_VOCAB)
	$(PY) -m minialign replicate $(QUICK_ARGS) --dry-run

# The grid on a SYNTHETIC world (no COCO needed; world v2, calibrated to COCO's caption
# statistics, #22): D=64, 1 block, 500 steps x 128 photos (the val curves flat over their last
# evaluations), an lr search over 1e-3..1e-2, every curve from step 0 (the untrained encoder).
# ~6.5 CPU-minutes: 3-4 min on 2 cores. Its matrices are tiny, so one BLAS thread is the fastest.
demo: $(DEMO_WORLD)/captions_synthetic.json  ## 3 objectives x seeds 0-2 + lr search, synthetic, ~5 min
	@OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m minialign replicate \
	    --captions $(DEMO_WORLD)/captions_synthetic.json \
	    --embeddings $(DEMO_WORLD)/embeddings_synthetic.npz --out $(DEMO) \
	    --steps 500 --batch-photos 128 --warmup-steps 25 --eval-every 50 --lr 3.16e-3 \
	    --lr-min 1e-3 --lr-max 1e-2 --d-model 64 --n-layers 1 --n-heads 4 \
	    --anticollapse $(ANTICOLLAPSE) --layers $(LAYERS) --dtype $(DTYPE) $(EXPECTED)

# Each choice the replication's write-up leaves unsaid, flipped alone (docs/protocol.md): the
# demo's protocol (3 objectives x seeds 0-2 at its lr, no search) per choice, and with real
# captions (replicate-quick's, if any) the text-side metrics at replicate-quick's size; one
# table in $(ABLATIONS)/ablations.md. Stop and rerun as replicate.
ABLATIONS  ?= results/ablations$(LAYERS_SUFFIX)
ablations: $(DEMO_WORLD)/captions_synthetic.json  ## each unsaid choice flipped: its effect beside the seeds' spread
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m minialign ablations \
	    --captions $(DEMO_WORLD)/captions_synthetic.json \
	    --embeddings $(DEMO_WORLD)/embeddings_synthetic.npz --out $(ABLATIONS) \
	    --steps 500 --batch-photos 128 --warmup-steps 25 --eval-every 50 --lr 3.16e-3 \
	    --d-model 64 --n-layers 1 --n-heads 4 --layers $(LAYERS) --dtype $(DTYPE) \
	    --text-captions "$(QUICK_CAPTIONS)" $(JOBS_FLAG)

demo-compare:       ## after `make demo` and `make demo ANTICOLLAPSE=sigreg`: VICReg vs SIGReg side by side
	$(PY) -m minialign report results/synthetic results/synthetic-sigreg

$(DEMO_WORLD)/captions_synthetic.json:
	$(PY) -m minialign synthetic --out $(DEMO_WORLD)

report:             ## rebuild results.md, results.json and the figures: make report RESULTS=results/synthetic
	$(PY) -m minialign report $(RESULTS)

# The scaling sweep (minialign/machinery/grid/scaling_run.py on replicate's machinery; the table,
# fig_scaling.png and the gap's trend: scaling_report.py). Stop and rerun as replicate; a rerun
# with the embeddings scores the finished runs without retraining. GRID=plus (default): widths
# 64 128 256 512 at L=4 and depths 2 4 8 at D=256, 6 sizes x 3 objectives x 3 seeds = 54 runs
# of 3000 steps x 256 photos at lr 1e-3; GRID=cross: every width x depth, 12 sizes, 108 runs.
SCALING      ?= results/coco-scaling$(LAYERS_SUFFIX)
GRID         ?= plus
SCALING_ARGS = --captions $(CAPTIONS) --embeddings $(EMBEDDINGS) --image-eval $(IMAGE_EVAL) \
	--out $(SCALING) --grid $(GRID) --layers $(LAYERS) --dtype $(DTYPE) $(JOBS_FLAG)

scaling:            ## encoder sizes x 3 objectives x seeds 0-2 at the replication's steps, batch, lr
	$(CHECK_CAPTIONS)
	$(PY) -m minialign scaling $(SCALING_ARGS)

eta-scaling:        ## the sweep's plan and time here and on a cluster (times every size); writes nothing
	$(CHECK_CAPTIONS)
	$(PY) -m minialign scaling $(SCALING_ARGS) --dry-run

# A few minutes on the SYNTHETIC world: widths 16 32 64 at L=1 and depths 1 2 at D=32
# (4 sizes) x 3 objectives x seeds 0 1, 100 steps x 64 photos at the demo's lr.
SCALING_DEMO ?= results/synthetic-scaling$(LAYERS_SUFFIX)
scaling-demo: $(DEMO_WORLD)/captions_synthetic.json  ## the sweep on the synthetic world, minutes
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(PY) -m minialign scaling \
	    --captions $(DEMO_WORLD)/captions_synthetic.json \
	    --embeddings $(DEMO_WORLD)/embeddings_synthetic.npz --out $(SCALING_DEMO) \
	    --widths 16 32 64 --depths 1 2 --center 32 1 --seeds 0 1 --steps 100 --batch-photos 64 \
	    --warmup-steps 10 --eval-every 20 --lr 3.16e-3 --layers $(LAYERS) --dtype $(DTYPE) --no-estimate $(JOBS_FLAG)

# ---- the course kit (docs/course.md): a student copy with every exercise blanked, and the grader.
# grade, exercises and demo print the tool's own lines and end quietly (exit 0) on an expected
# outcome: a table with exercises not passed yet, a refusal (exit codes 1 and 2 of the command).
# STRICT=1 passes the command's exit code on, for scripts and CI (`python -m minialign grade`
# itself exits 1 when some exercise did not pass, 2 on a refusal).
STRICT     ?=
EXPECTED    = $(if $(STRICT),,|| { code=$$?; [ $$code -le 2 ] || exit $$code; })
OUT        ?=
EXERCISES  ?=
SOLVED     ?=
RESTORE    ?=
STUDENT    ?=
exercises:          ## make exercises OUT=../course [SOLVED="1 2"] [STUDENT=id] | RESTORE="1 4": the student copy (OUT new or empty) | put those solutions back into it
	@$(PY) -m minialign exercises $(OUT) $(if $(SOLVED),--solved $(SOLVED)) \
	    $(if $(STUDENT),--student $(STUDENT)) $(if $(RESTORE),--restore $(RESTORE)) $(EXPECTED)

grade:              ## each exercise's own tests, one row each: make grade [EXERCISES="1 4"] [STRICT=1]
	@$(PY) -m minialign grade $(EXERCISES) $(EXPECTED)
