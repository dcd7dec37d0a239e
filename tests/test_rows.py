"""The row pool (minialign/machinery/fastpath/rows.py) and the per-token layers that run on it
(machinery/fastpath/fast_rows.py): the references' outputs and gradients on ragged row counts,
the same bits on 1, 2 or 3 threads, and no float64 scalar or array inside a float32 step."""
import ast
import inspect
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
from gradcheck import check_layer, rel_err

from minialign import layers, model
from minialign.data import Batch
from minialign.machinery.fastpath import fast, fast_rows, rows
from minialign.machinery.run import machine
from minialign.machinery.fastpath.fast_rows import (embedding_backward_rows, embedding_forward_rows,
                                                    gelu_backward_fast, gelu_forward_fast,
                                                    layernorm_backward_rows, layernorm_forward_rows,
                                                    linear_backward_rows, linear_forward_rows)
from minialign.model import ModelConfig, encode, encode_backward, init_params
from minialign.train import TrainConfig, train_step
from minialign.optim import adam_init

# row counts: under one block, a block and one row, several blocks with a ragged last one,
# and (with small_blocks' GEMM blocks) every size of rows.gemm_blocks' taper
ROW_COUNTS = (5, rows.ROW_BLOCK + 1, 3 * rows.ROW_BLOCK + 17, 9 * rows.ROW_BLOCK + 3)
# float32 against the float64-exact reference: the fast path adds in other orders (per row
# block, partials in block order) and rounds its constants to float32; each output is a sum of
# at most ~600 terms of size ~1, so its error is a few hundred float32 ulps (6e-8) at most
FLOAT32_TOL = 2e-5
FLOAT64_TOL = 1e-12  # the same maths in float64: only the order of additions differs


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Element-wise blocks of ROW_BLOCK rows at these tests' width D = 12 (block_rows reads
    BLOCK_ELEMENTS at the call) and GEMM blocks of 64 rows tapering to 8 (gemm_blocks reads
    GEMM_BLOCK and GEMM_TAIL at the call), so the row counts above span several blocks of each
    kind, as the (n, 256) and (n, 1024) rows of a training step do."""
    monkeypatch.setattr(rows, "BLOCK_ELEMENTS", 12 * rows.ROW_BLOCK)
    monkeypatch.setattr(rows, "GEMM_BLOCK", 64)
    monkeypatch.setattr(rows, "GEMM_TAIL", 8)


@pytest.fixture
def pool_threads():
    """Set the pool's thread count inside a test; restores the previous one afterwards."""
    before = rows._THREADS
    yield rows.set_threads
    rows._THREADS = before


def layer_pairs(rng, n, dtype):
    """(name, reference outputs, fast outputs) of every rows layer, forward and backward,
    on n rows of width D = 12, F = 20, each from the same float64 draws cast to dtype."""
    D, F, V, T = 12, 20, 9, 7
    draw = lambda *shape: rng.standard_normal(shape).astype(dtype)
    x, gamma, beta, dy = draw(n, D), draw(D), draw(D), draw(n, D)
    w, b, dyF = draw(D, F), draw(F), draw(n, F)
    tok, pos = rng.integers(0, V, n), rng.integers(0, T, n)
    tok_emb, pos_emb = draw(V, D), draw(T, D)
    out = []
    y, c = layers.layernorm_forward(x, gamma, beta)
    y_f, c_f = layernorm_forward_rows(x, gamma, beta)
    out.append(("layernorm", (y, *layers.layernorm_backward(dy, c)),
                (y_f, *layernorm_backward_rows(dy, c_f))))
    y, c = layers.linear_forward(x, w, b)
    y_f, c_f = linear_forward_rows(x, w, b)
    out.append(("linear", (y, *layers.linear_backward(dyF, c)),
                (y_f, *linear_backward_rows(dyF, c_f))))
    y, c = layers.gelu_forward(4 * dyF)
    y_f, c_f = gelu_forward_fast(4 * dyF)
    out.append(("gelu", (y, layers.gelu_backward(dyF, c)), (y_f, gelu_backward_fast(dyF, c_f))))
    for ids, weight in ((tok, tok_emb), (pos, pos_emb)):
        y, c = layers.embedding_forward(ids, weight)
        y_f, c_f = embedding_forward_rows(ids, weight)
        out.append(("embedding", (y, layers.embedding_backward(dy, c)),
                    (y_f, embedding_backward_rows(dy, c_f))))
    return out


@pytest.mark.parametrize("n", ROW_COUNTS)
@pytest.mark.parametrize("dtype, tol", [(np.float64, FLOAT64_TOL), (np.float32, FLOAT32_TOL)])
def test_rows_layers_equal_the_reference(n, dtype, tol):
    for name, reference, fast in layer_pairs(np.random.default_rng(n), n, dtype):
        assert len(reference) == len(fast), name
        for i, (r, f) in enumerate(zip(reference, fast)):
            assert f.dtype == dtype and f.shape == r.shape, (name, i, f.dtype, f.shape)
            assert rel_err(f, r) < tol, f"{name} output {i}: relative error {rel_err(f, r):.1e}"


@pytest.mark.parametrize("n", ROW_COUNTS)
def test_rows_layers_bit_identical_for_any_thread_count(n, pool_threads):
    results = []
    for k in (1, 2, 3):
        pool_threads(k)
        results.append(layer_pairs(np.random.default_rng(1), n, np.float32))
    for name_fast in zip(*results):
        (name, _, fast1), (_, _, fast2), (_, _, fast3) = name_fast
        for a, b, c in zip(fast1, fast2, fast3):
            assert a.tobytes() == b.tobytes() == c.tobytes(), name


def test_rows_layers_against_finite_differences():
    """Gradient checks (float64, every element) with several row blocks and partials."""
    rng = np.random.default_rng(3)
    n, D, F = 2 * rows.GEMM_BLOCK + 5, 3, 4        # weight-gradient partials: 64, 32, 16, 8, 8, 5
    x = rng.standard_normal((n, D))
    check_layer(layernorm_forward_rows, layernorm_backward_rows,
                dict(x=x, gamma=rng.standard_normal(D), beta=rng.standard_normal(D)), (n, D), rng)
    check_layer(linear_forward_rows, linear_backward_rows,
                dict(x=x, w=rng.standard_normal((D, F)), b=rng.standard_normal(F)), (n, F), rng)
    check_layer(gelu_forward_fast, gelu_backward_fast, dict(x=3 * x), (n, D), rng)


def test_sum_partials_adds_in_slot_order():
    """Float32 rounding shows the order: 1e8 + 1 - 1e8 is 0 in that order, 1 in another."""
    partials = np.array([[1e8] * 3, [1.0] * 3, [-1e8] * 3], dtype=np.float32)   # (P, C)
    np.testing.assert_array_equal(rows.sum_partials(partials), [0.0, 0.0, 0.0])
    big = np.ones((3, 300, 300), dtype=np.float32) * partials[:, :1, None]      # the pooled path
    np.testing.assert_array_equal(rows.sum_partials(big), 0.0)


def test_row_blocks_depend_only_on_n(pool_threads):
    pool_threads(3)
    assert rows.row_blocks(0) == [] and rows.row_blocks(3, 2) == [(0, 2), (2, 3)]
    assert rows.row_blocks(130) == [(0, 64), (64, 128), (128, 130)]
    assert rows.block_rows(12) == 64 and rows.block_rows(20) == 38 and rows.block_rows(10**6) == 1
    x, dy = np.ones((0, 4), np.float32), np.ones((0, 5), np.float32)
    np.testing.assert_array_equal(rows.matmul_tn_rows(x, dy), np.zeros((4, 5)))


def test_run_reraises_and_refuses_zero_threads(pool_threads):
    pool_threads(2)

    def task(i):
        if i == 5:
            raise KeyError("block 5")

    with pytest.raises(KeyError, match="block 5"):
        rows.run(task, 8)
    with pytest.raises(ValueError, match="k=0 must be an integer >= 1"):
        rows.set_threads(0)


def test_use_cores_sizes_the_pool_whose_gemms_run_on_one_blas_thread(pool_threads):
    before = machine.cores()
    seen = []
    try:
        machine.use_cores(2)
        assert rows.threads() == 2 and machine.blas_threads() == 1   # outside the pool too
        rows.run(lambda i: seen.append(machine.blas_threads()), 3)
        assert seen == [1, 1, 1]
        with machine.blas_on(2):                          # bench's peak and replayed GEMMs
            assert machine.blas_threads() == min(2, machine.available_cores())
        assert machine.blas_threads() == 1                # restored
    finally:
        machine.use_cores(before)


# ---------------------------------------------------------------- the whole model
TINY = ModelConfig(vocab_size=30, max_len=9, d_model=16, n_layers=2, n_heads=2, mlp_ratio=4)


def tiny_batch(rng, B=40):
    """B photos, two ragged captions each (lengths 2..9): 500-700 packed rows, several blocks."""
    def captions():
        tokens = rng.integers(5, TINY.vocab_size, size=(B, TINY.max_len)).astype(np.int32)
        lengths = rng.integers(2, TINY.max_len + 1, size=B)
        tokens[np.arange(TINY.max_len)[None, :] >= lengths[:, None]] = 0
        return tokens
    return Batch(photos=np.arange(B), tokens_a=captions(), tokens_b=captions())


@pytest.mark.parametrize("objective", ["good_views", "bad_views", "next_token"])
def test_training_step_bit_identical_for_any_thread_count(objective, pool_threads):
    cfg = TrainConfig(objective=objective, model=TINY)
    outputs = []
    for k in (1, 2, 3):
        machine.use_cores(k)                              # the pool's size; BLAS stays at 1
        params = init_params(TINY, np.random.default_rng(0))
        loss, _, norm = train_step(params, adam_init(params), tiny_batch(np.random.default_rng(1)),
                                   cfg, 1e-3, np.random.default_rng(2))
        outputs.append((loss, norm, b"".join(params[k].tobytes() for k in sorted(params))))
    assert outputs[0] == outputs[1] == outputs[2]


# float64 scalars in code another change rewrites (issue #11: attention's `scores *= scale`,
# scale = 1 / np.sqrt(Dh)); remove each entry when its function keeps float32
KNOWN_LEAKS = set()  # none left: the attention scale became a float32 scalar (attention_scale)
ALLOCATORS = ("empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like",
              "full_like", "concatenate")


class Float32Only(np.ndarray):
    """An ndarray that records every ufunc (matmul included) that reads a float64 scalar or
    array next to a float32 one: NumPy 2 then runs the float64 loop and rounds back."""
    leaks = []

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        plain = lambda a: a.view(np.ndarray) if isinstance(a, Float32Only) else a
        dtypes = {np.asarray(a).dtype for a in inputs if isinstance(a, (np.ndarray, np.generic))}
        if np.dtype(np.float32) in dtypes and np.dtype(np.float64) in dtypes:
            frame = inspect.stack()[1]
            where = frame.frame.f_code.co_qualname                   # "layer.<locals>.block"
            if where.split(".")[0] not in KNOWN_LEAKS:
                Float32Only.leaks.append(f"{ufunc.__name__} in {where} at "
                                         f"{Path(frame.filename).name}:{frame.lineno} "
                                         f"{frame.code_context[0].strip()}")
        if out is not None:
            kwargs["out"] = tuple(plain(o) for o in out)
        result = getattr(ufunc, method)(*(plain(a) for a in inputs), **kwargs)
        wrap = lambda r: r.view(Float32Only) if isinstance(r, np.ndarray) else r
        return tuple(map(wrap, result)) if isinstance(result, tuple) else wrap(result)


def watch_allocations(monkeypatch):
    """np.empty, np.zeros, ... return Float32Only too: buffers a layer makes are watched."""
    for name in ALLOCATORS:
        original = getattr(np, name)

        def allocate(*args, original=original, **kwargs):
            result = original(*args, **kwargs)
            return result.view(Float32Only) if result.dtype.kind == "f" else result
        monkeypatch.setattr(np, name, allocate)


def float_arrays(value):
    """Every float ndarray inside nested tuples, lists and dicts (a cache)."""
    if isinstance(value, np.ndarray):
        return [value] if value.dtype.kind == "f" else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in float_arrays(v)]
    return []


@pytest.mark.parametrize("objective", ["good_views", "bad_views", "next_token"])
def test_float32_step_has_no_float64_intermediate(objective, pool_threads, monkeypatch):
    """One float32 training step with every parameter a Float32Only: fails on any ufunc that
    mixes float64 into float32 (x *= np.float64(c), x / np.sqrt(D), a float64 buffer), and on
    any float64 array the encoder's cache, the loss's gradients or the step's grads hold."""
    pool_threads(2)
    watch_allocations(monkeypatch)
    cfg = TrainConfig(objective=objective, model=TINY)
    params = init_params(TINY, np.random.default_rng(0))
    params = {k: v.view(Float32Only) for k, v in params.items()}
    batch = tiny_batch(np.random.default_rng(1))
    Float32Only.leaks = []
    tokens = np.concatenate([batch.tokens_a, batch.tokens_b])
    z, hf, cache = encode(params, tokens, TINY, causal=objective == "next_token")
    grads = encode_backward(np.ones_like(z), np.ones_like(hf), cache)
    arrays = float_arrays(cache) + float_arrays(grads) + [z, hf]
    assert {a.dtype for a in arrays} == {np.dtype(np.float32)}
    train_step(params, adam_init(params), batch, cfg, 1e-3, np.random.default_rng(2))
    assert Float32Only.leaks == []


def test_the_float64_detector_catches_a_leak(pool_threads, monkeypatch):
    """The detector above, on a planted leak: LayerNorm's 1/D as a float64 scalar."""
    watch_allocations(monkeypatch)
    monkeypatch.setattr(fast_rows, "_const", lambda value, like: np.float64(value))
    Float32Only.leaks = []
    x = np.random.default_rng(0).standard_normal((70, 8)).astype(np.float32).view(Float32Only)
    layernorm_forward_rows(x, np.ones(8, np.float32), np.zeros(8, np.float32))
    assert any("layernorm_forward_rows" in leak for leak in Float32Only.leaks)


def test_no_float64_constant_in_the_rows_code():
    """fast_rows.py and model.py's encoder never name float64 or build a NumPy scalar from a
    Python number (np.sqrt(2.0), np.float64(c)): constants go through fast_rows._const, which
    takes the array's dtype."""
    for name, text in (("fast_rows", inspect.getsource(fast_rows)),
                       ("model.encode", inspect.getsource(model.encode)),
                       ("model.encode_backward", inspect.getsource(model.encode_backward)),
                       ("fast.lm_head", inspect.getsource(fast.lm_head_forward)
                        + inspect.getsource(fast.cross_entropy)
                        + inspect.getsource(fast.lm_head_backward))):
        tree = ast.parse(inspect.cleandoc("\n" + text) if text.startswith(" ") else text)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("float64", "double"):
                pytest.fail(f"{name}: names np.{node.attr} (line {node.lineno})")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "np"
                    and node.args and all(isinstance(a, ast.Constant) for a in node.args)):
                pytest.fail(f"{name}: np.{node.func.attr} of a constant (line {node.lineno})")


def test_run_inside_a_task_runs_inline(pool_threads):
    """A task that itself calls run() (nested) finishes instead of waiting on busy workers."""
    pool_threads(2)
    out = np.zeros((4, 3))

    def task(i):
        def inner(j):
            out[i, j] = 10 * i + j
        rows.run(inner, 3)

    rows.run(task, 4)
    np.testing.assert_array_equal(out, np.arange(4)[:, None] * 10 + np.arange(3))


@pytest.mark.parametrize("n_ids", (1, 3, 40))
def test_scatter_add_rows_gives_np_add_at_bit_for_bit(n_ids):
    """Ids read once, a few times (rounds) and more than SCATTER_ROUNDS times (one sum each),
    ids never read, and a -0 row (np.add.at's zeros turn it into +0)."""
    rng = np.random.default_rng(n_ids)
    ids = rng.integers(0, n_ids, 300)                                     # some ids > 8 rows
    ids[:5] = n_ids + np.arange(5)                                        # ids read once
    dy = rng.standard_normal((300, 12)).astype(np.float32)
    dy[0] = -0.0
    expected = np.zeros((n_ids + 7, 12), np.float32)
    np.add.at(expected, ids, dy)
    got = fast_rows.scatter_add_rows(dy, ids, expected.shape)
    assert np.bincount(ids).max() > fast_rows.SCATTER_ROUNDS or n_ids == 40
    assert got.tobytes() == expected.tobytes()
    assert fast_rows.scatter_add_rows(dy[:0], ids[:0], (3, 12)).tolist() == [[0.0] * 12] * 3


def test_a_followed_pool_takes_its_new_size_between_operations(pool_threads):
    """rows.follow: the size is re-read at a top-level run's entry, never inside one."""
    shared = multiprocessing.get_context("spawn").Value("i", 1)
    sizes = []

    def task(i):
        shared.value = 3                                  # the parent rebalances meanwhile
        sizes.append(rows.threads())

    try:
        pool_threads(2)
        rows.follow(shared)
        rows.run(task, 4)
        assert sizes == [1, 1, 1, 1]                      # taken at entry, kept to the end
        rows.run(lambda i: sizes.append(rows.threads()), 2)
        assert sizes[4:] == [3, 3]
        shared.value = 0                                  # 0: keep the current size
        rows.run(lambda i: sizes.append(rows.threads()), 1)
        assert sizes[6:] == [3]
    finally:
        rows.follow(None)


def test_workers_take_the_callers_errstate(pool_threads):
    """train_step's np.errstate(over="ignore") holds inside the pool's worker threads too."""
    pool_threads(2)
    seen = []
    with np.errstate(over="ignore", invalid="raise"):
        rows.run(lambda i: seen.append((np.geterr()["over"], np.geterr()["invalid"])), 4)
    assert seen == [("ignore", "raise")] * 4
