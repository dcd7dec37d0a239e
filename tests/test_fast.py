"""The fast layer set (minialign/machinery/fast.py) against the reference (minialign/layers.py):
every layer's outputs and gradients on a ragged batch (an empty caption, captions of length 1,
ties, causal and not, several blocks of every kind, the last one ragged), whole objective
steps, the same bits on any number of threads. float64 to 1e-10, float32 to 1e-4; dtype kept.

Each check takes the module it checks (`ops`), so that MUTANTS, plausible wrong versions of
fast.py, go through the same checks: each must fail at least one."""
import inspect
import types
import warnings

import numpy as np
import pytest
from conftest import NEEDS_FAST_PATH
from gradcheck import rel_err

from minialign import layers, losses, model
from minialign.data import Batch
from minialign.model import ModelConfig, init_params
from minialign.objectives import OBJECTIVES
from minialign.tokenizer import BOS, EOS, MASK, UNK
from minialign.train import TrainConfig

pytestmark = NEEDS_FAST_PATH
fast = model.fast
CORE = ("good_views", "bad_views", "next_token")
TOL = {np.float64: 1e-10, np.float32: 1e-4}
LENGTHS = np.array([5, 2, 7, 1, 0, 4, 7, 2, 5, 5, 1, 3])   # T = 8: 42 tokens, ties, an empty one
SMALL = dict(BLOCK=48, HEAD_ROWS=8, CE_ROWS=3, GROUP=2)    # blocks of 4 rows at D = 12, ...


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    for k, v in SMALL.items():
        monkeypatch.setattr(fast, k, v)
    yield
    fast.set_threads(1)


def captions(rng, lengths, T, V):
    """(B, T) int32 tokens: BOS, words with UNK and MASK among them, EOS; PAD after."""
    tokens = rng.integers(5, V, size=(len(lengths), T))
    tokens[rng.random(tokens.shape) < 0.1] = UNK
    tokens[rng.random(tokens.shape) < 0.1] = MASK
    tokens[:, 0] = BOS
    tokens[np.arange(len(lengths)), np.maximum(lengths - 1, 1)] = EOS
    tokens[np.arange(T)[None, :] >= lengths[:, None]] = 0
    return tokens.astype(np.int32)


def compare(name, got, expected, dtype):
    """Each fast output against the reference's: shape, dtype, relative error."""
    assert len(got) == len(expected), name
    for i, (f, r) in enumerate(zip(got, expected)):
        assert f.shape == r.shape and f.dtype == dtype, (name, i, f.shape, r.shape, f.dtype)
        assert rel_err(f, r) < TOL[dtype], f"{name} output {i}: error {rel_err(f, r):.1e}"


def check_layers(ops, dtype, causal):
    """Every layer pair on the ragged batch, fast rows put back in the reference's (caption)
    order through caption_rows; inputs with non-zero means and unequal column scales; logits
    up to ~1e3 (no overflow); no input written to."""
    rng = np.random.default_rng(1)
    mask = np.arange(8)[None, :] < LENGTHS[:, None]                       # (12, 8)
    fr, rr = ops.token_rows(mask, causal, dtype), layers.token_rows(mask, causal, dtype)
    n, D, F, H, V = int(mask.sum()), 12, 20, 3, 11

    def draw(*shape):
        return ((rng.standard_normal(shape) + 0.3) * rng.uniform(0.5, 2, shape[-1])).astype(dtype)
    x, dy, dyF, w, b, g, beta = (draw(*s) for s in ((n, D), (n, D), (n, F), (D, F), (F,), (D,),
                                                     (D,)))
    emb, attn = draw(V, D), (draw(D, 3 * D), draw(3 * D), draw(D, D), draw(D))
    ids = captions(rng, LENGTHS, 8, V).ravel()[rr.flat]                   # (n,) with repeats
    inputs = [x, dy, dyF, w, b, g, beta, emb, *attn]
    before = [a.copy() for a in inputs]
    for name, args, d in (("embedding", (ids, emb), dy), ("linear", (x, w, b), dyF),
                          ("layernorm", (x, g, beta), dy), ("gelu", (4 * x,), dy)):
        (yf, cf), (yr, cr) = (getattr(s, f"{name}_forward")(*args) for s in (ops, layers))
        gf, gr = (getattr(s, f"{name}_backward")(d, c) for s, c in ((ops, cf), (layers, cr)))
        gf, gr = ((g,) if name in ("embedding", "gelu") else g for g in (gf, gr))
        compare(name, (yf, *gf), (yr, *gr), dtype)
    to_fast = lambda a: a[np.argsort(fr.caption_rows)]                   # caption -> fast order
    yf, cf = ops.attention_forward(to_fast(x), *attn, fr, H)
    yr, cr = layers.attention_forward(x, *attn, rr, H)
    gf, gr = ops.attention_backward(to_fast(dy), cf), layers.attention_backward(dy, cr)
    compare("attention", (yf[fr.caption_rows], gf[0][fr.caption_rows], *gf[1:]), (yr, *gr),
            dtype)
    dz = draw(len(mask), D)
    (zf, cf), (zr, cr) = ops.pool_forward(to_fast(x), fr), layers.pool_forward(x, rr)
    compare("pool", (zf, ops.pool_backward(dz, cf)[fr.caption_rows]),
            (zr, layers.pool_backward(dz, cr)), dtype)
    assert not zf[LENGTHS == 0].any()                                     # the empty caption
    hf = x * np.where(np.arange(n) % 2, 300, 1)[:, None].astype(dtype)    # (n, D)
    logits, c = layers.lm_head_forward(hf, emb)
    loss_r, dlogits, _ = losses.cross_entropy(logits, ids)                # specials as targets
    logits_f, c_f = ops.lm_head_forward(hf, emb)
    loss_f, dlogits_f, stats_f = ops.cross_entropy(logits_f, ids)
    assert isinstance(loss_f, float) and abs(loss_f - loss_r) < TOL[dtype] * loss_r
    assert stats_f == {"ce": loss_f, "targets": n}
    compare("head", ops.lm_head_backward(dlogits_f, c_f), layers.lm_head_backward(dlogits, c),
            dtype)
    assert all(np.array_equal(a, b) for a, b in zip(inputs, before)), "an input was written to"


def objective_step(ops, objective, dtype, layer_set="fast", batch_seed=2):
    """An objective's (loss, grads) on a ragged batch (an empty and a one-token caption among
    its 16 a captions), with `ops` as the fast set."""
    m = ModelConfig(vocab_size=30, max_len=9, d_model=12, n_layers=2, n_heads=3,
                    layers=layer_set, dtype=np.dtype(dtype).name)
    rng = np.random.default_rng(0)
    params = {k: (p + 0.1 * rng.standard_normal(p.shape)).astype(dtype)     # off 0 and 1
              for k, p in init_params(m, rng).items()}
    rng = np.random.default_rng(batch_seed)
    lengths_a, lengths_b = rng.integers(1, 10, 16), rng.integers(1, 10, 16)
    lengths_a[:2] = 0, 1
    batch = Batch(np.arange(16), captions(rng, lengths_a, 9, 30), captions(rng, lengths_b, 9, 30))
    saved, model.fast = model.fast, ops
    try:
        loss, grads, _ = OBJECTIVES[objective](params, batch, TrainConfig(objective, model=m),
                                               np.random.default_rng(3))
    finally:
        model.fast = saved
    return loss, grads


def check_objective(ops, objective, dtype):
    """Loss and every gradient of a whole step, fast against reference, each relative to its
    largest entry or, if smaller, 1% of the step's largest: ln_f.beta's true gradient under
    VICReg is 0 (shifting every z changes no term), so what both sets compute is rounding."""
    loss_f, grads_f = objective_step(ops, objective, dtype)
    loss_r, grads_r = objective_step(ops, objective, dtype, "reference")
    assert abs(loss_f - loss_r) < TOL[dtype] * abs(loss_r), (loss_f, loss_r)
    assert list(grads_f) == list(grads_r)
    largest = max(np.abs(g).max() for g in grads_r.values())
    for k, r in grads_r.items():
        scale = max(np.abs(r).max(), 1e-2 * largest)
        assert grads_f[k].dtype == dtype, k
        assert np.abs(grads_f[k] - r).max() < TOL[dtype] * scale, f"d{k}"


def check_rows(ops):
    """token_rows' contract on random masks: flat, pos, seq and caption_rows mean what
    layers.TokenRows's mean; the groups cover every row once, each Bg whole captions of Tg."""
    rng = np.random.default_rng(4)
    for causal in (False, True):
        mask = np.arange(9)[None, :] < rng.integers(0, 10, 30)[:, None]    # (30, 9)
        rows = ops.token_rows(mask, causal, np.float32)
        assert np.array_equal(rows.flat[rows.caption_rows], np.flatnonzero(mask))
        assert np.array_equal(np.stack([rows.seq, rows.pos]), np.divmod(rows.flat, 9))
        covered = np.concatenate([np.arange(g.start, g.stop) for g in rows.groups])
        assert np.array_equal(covered, np.arange(mask.sum()))
        for g in rows.groups:
            seq = rows.seq[g.start:g.stop].reshape(g.Bg, g.Tg)
            assert (seq == seq[:, :1]).all() and (mask[seq[:, 0]].sum(axis=1) == g.Tg).all()
            assert (rows.pos[g.start:g.stop].reshape(g.Bg, g.Tg) == np.arange(g.Tg)).all()
            assert g.Bg <= ops.GROUP and (g.bias is not None) == causal


def check_rows_by_hand(ops):
    """Lengths 3, 0, 1, 3, 2 (T = 4): shortest first, ties in batch order."""
    mask = np.arange(4)[None, :] < np.array([3, 0, 1, 3, 2])[:, None]
    rows = ops.token_rows(mask, True, np.float32)
    assert rows.flat.tolist() == [8, 16, 17, 0, 1, 2, 12, 13, 14]         # b * 4 + t
    assert rows.caption_rows.tolist() == [3, 4, 5, 0, 6, 7, 8, 1, 2]
    assert [g[:5] for g in rows.groups] == [(0, 1, 1, 1, 1), (1, 3, 2, 1, 2), (3, 9, 3, 2, 3)]
    assert rows.groups[2].bias.dtype == np.float32
    assert rows.groups[2].bias.tolist() == [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]]


def check_threads(ops, objective="next_token"):
    """A float32 step on 1, 2 and 3 threads: the same bits."""
    steps = []
    for k in (1, 2, 3):
        ops.set_threads(k)
        loss, grads = objective_step(ops, objective, np.float32, batch_seed=5)
        steps.append((loss, [g.tobytes() for g in grads.values()]))
    ops.set_threads(1)
    assert steps[0] == steps[1] == steps[2]


def run_checks(ops):
    check_rows(ops)
    check_rows_by_hand(ops)
    check_threads(ops)
    for causal in (False, True):
        check_layers(ops, np.float64, causal)
    for objective in CORE:
        check_objective(ops, objective, np.float64)


# float64, and next_token on threads: run_checks, in test_the_checks_pass_on_a_copy_of_fast
@pytest.mark.parametrize("causal", [False, True])
def test_each_layer_gives_the_references_outputs_and_gradients_in_float32(causal):
    check_layers(fast, np.float32, causal)


@pytest.mark.parametrize("objective", CORE)
def test_a_whole_step_gives_the_references_loss_and_gradients_in_float32(objective):
    check_objective(fast, objective, np.float32)


@pytest.mark.parametrize("objective", ["good_views", "bad_views"])
def test_the_same_bits_on_any_number_of_threads(objective):
    check_threads(fast, objective)


def test_run_reraises_a_tasks_error_and_passes_on_errstate():
    fast.set_threads(2)
    seen = []

    def task(i, s, e):
        seen.append(np.geterr()["over"])
        if i == 3:
            raise KeyError("block 3")
    with np.errstate(over="ignore"), pytest.raises(KeyError, match="block 3"):
        fast.run(task, fast.row_blocks(10, 2))
    assert set(seen) == {"ignore"}


def test_no_reference_function_runs_in_a_fast_step(monkeypatch):
    """A teacher blanks a layers.py function: the fast set does not notice."""
    def blank(*args, **kwargs):
        raise NotImplementedError
    for name, f in vars(layers).items():
        if inspect.isfunction(f):
            monkeypatch.setattr(layers, name, blank)
    monkeypatch.setattr(losses, "cross_entropy", blank)
    for objective in CORE:
        assert np.isfinite(objective_step(fast, objective, np.float32)[0])


def test_gelu_at_large_inputs_without_overflow_warning():
    x = np.array([[-100.0, -20.0, 0.0, 20.0, 100.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, cache = fast.gelu_forward(x)
        dx = fast.gelu_backward(np.ones_like(x), cache)
    assert y.tolist() == [[0.0, 0.0, 0.0, 20.0, 100.0]] and dx.tolist() == [[0, 0, 0.5, 1, 1]]


def test_cross_entropy_over_zero_targets_is_an_error():
    logits, _ = fast.lm_head_forward(np.zeros((0, 4)), np.ones((6, 4)))
    with pytest.raises(ValueError, match="zero targets"):
        fast.cross_entropy(logits, np.zeros(0, int))


MUTANTS = {   # name: (text of fast.py, its replacement)
    "causal mask lets a token read the next": ("dtype), 1)", "dtype), 2)"),
    "causal bias never added": ("if g.bias is not None:", "if False:"),
    "pool divides by T, not the length": ("zg /= _c(g.Tg, h)", "zg /= _c(rows.lengths[-1], h)"),
    "pool backward forgets the length": ("/ n_b.astype(dz.dtype)[:, None]", ""),
    "layernorm's variance over D - 1": ("st *= inv_D\n        st += eps",
                                        "st *= _c(1 / (D - 1), x)\n        st += eps"),
    "layernorm backward without the xhat term": ("        g -= tb\n", ""),
    "layernorm dgamma of the first block": ("dgamma.sum(axis=0), dbeta", "dgamma[0], dbeta"),
    "gelu's cubic term doubled": ("-2.0 * GELU_A * GELU_C, x)", "-4.0 * GELU_A * GELU_C, x)"),
    "gelu backward 2 a x^2 for 3 a x^2": ("6.0 * GELU_A", "4.0 * GELU_A"),
    "attention scaled by 1/sqrt(D)": ("math.sqrt(D // H)", "math.sqrt(D)"),
    "softmax backward without the row sum": ("ds -= np.einsum", "ds += 0 * np.einsum"),
    "dk from ds, not ds^T": ("np.matmul(ds.swapaxes(-1, -2), q", "np.matmul(ds, q"),
    "onehot not divided by n": ("xi[r, t] -= inv_n", "xi[r, t] -= 1"),
    "dtok_emb without the last chunk": ("partials.sum(axis=0)", "partials[:-1].sum(axis=0)"),
    "loss averaged over n + 1": ("float(nll.mean())", "float(nll.sum() / (n + 1))"),
    "db misses each chunk's last row": ("ones[:e - s], dy[s:e]", "ones[:e - s - 1], dy[s:e - 1]"),
    "a row's caption is its place in length order": ("seq = order[i]", "seq = i"),
    "embedding backward drops the first id's rows": ("np.r_[True, sorted", "np.r_[False, sorted"),
    "a group takes the next length too": ("[Tg, Tg + 1])", "[Tg, Tg + 2])"),
    # written after the checks, not to fit them
    "embedding reads the id before": ("weight[ids], (ids", "weight[np.maximum(ids - 1, 0)], (ids"),
    "pool leaves z in row order": ("z[np.argsort(rows.order)], rows", "z, rows"),
    "caption_rows reversed": ("np.argsort(flat, kind", "np.argsort(-flat, kind"),
    "cross-entropy without the max shift": ("xi -= xi.max(axis=1, keepdims=True)", "xi -= 0"),
    "layernorm without eps": ("        st += eps\n", ""),
    "softmax normalised over queries": ('"...ts->...t", p)[..., None]',
                                        '"...ts->...s", p)[..., None, :]'),
    "threads skip the last block": ("range(len(blocks))))", "range(len(blocks) - 1)))"),
    "bias added twice in the first block": ("y[s:e] += b\n", "y[s:e] += b * (1 + (i == 0))\n"),
    "gelu backward forgets dy": ("        d *= dy[s:e]\n", ""),
    "dgamma from dy, not dy xhat": ("ones_r[:e - s], tb, out=dgamma",
                                    "ones_r[:e - s], dy[s:e], out=dgamma"),
    "nll without the log": ("np.log(total.astype(np.float64)) - x_t", "total - x_t"),
    "dv from p, not p^T": ("np.matmul(p.swapaxes(-1, -2), dag", "np.matmul(p, dag"),
    "pool backward in batch order": ("dz[rows.order[full]] /", "dz[full] /"),
}


def mutant(old, new):
    """fast.py with the one `old` replaced by `new`, as a module of its own, SMALL blocks."""
    source = inspect.getsource(fast)
    assert source.count(old) == 1, old
    module = types.ModuleType("minialign.machinery.fast_mutant")
    module.__package__ = "minialign.machinery"
    exec(compile(source.replace(old, new), "fast_mutant.py", "exec"), module.__dict__)
    module.__dict__.update(SMALL)
    return module


def test_the_checks_pass_on_a_copy_of_fast():
    """The reference passes every check, token_rows' among them (by hand and on random masks)."""
    run_checks(mutant("import math", "import math"))


@pytest.mark.parametrize("name", MUTANTS)
def test_each_mutant_fails_a_check(name):
    ops = mutant(*MUTANTS[name])
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        with pytest.raises(Exception):                                    # wrong, or a crash
            run_checks(ops)
