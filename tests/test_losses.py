"""VICReg and cross-entropy: values computed by hand, gradients by central differences."""
import numpy as np
import pytest
from gradcheck import numerical_grad, rel_err

from minialign.losses import cross_entropy, vicreg_loss


def test_vicreg_hand_computed():
    z_a = np.array([[1.0, 0.0], [-1.0, 0.0]])
    z_b = np.array([[1.0, 1.0], [-1.0, -1.0]])
    loss, _, stats = vicreg_loss(z_a, z_b)
    # inv: diff = [[0, -1], [0, 1]] -> 2 / (N D = 4) = 0.5
    assert stats["inv"] == pytest.approx(0.5, abs=1e-12)
    # var: z_a dim 1 is constant, std = sqrt(0 + 1e-4) = 0.01 -> hinge 0.99, mean over D -> 0.495;
    # every other dim has unbiased variance 2 > 1 -> 0. Averaged over branches: 0.2475
    assert stats["var"] == pytest.approx(0.2475, abs=1e-12)
    # cov: C_a = [[2, 0], [0, 0]] -> 0; C_b = [[2, 2], [2, 2]] -> (2^2 + 2^2) / D = 4
    assert stats["cov"] == pytest.approx(4.0, abs=1e-12)
    assert loss == pytest.approx(25 * 0.5 + 25 * 0.2475 + 4.0, abs=1e-12)


def test_vicreg_gradients():
    rng = np.random.default_rng(0)
    scale = np.array([0.3, 2.0, 0.8, 1.5])               # some dims below the std target, some above
    z_a = rng.standard_normal((6, 4)) * scale
    z_b = z_a + 0.5 * rng.standard_normal((6, 4))
    for weights in [(25.0, 25.0, 1.0), (0.0, 25.0, 1.0), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)]:
        loss = lambda: vicreg_loss(z_a, z_b, *weights)[0]
        _, (dz_a, dz_b), _ = vicreg_loss(z_a, z_b, *weights)
        for name, analytic, wrt in [("z_a", dz_a, z_a), ("z_b", dz_b, z_b)]:
            err = rel_err(analytic, numerical_grad(loss, wrt))
            assert err < 1e-7, f"d{name} with weights {weights}: relative error {err:.1e}"


def test_vicreg_rejects_one_pair():
    with pytest.raises(ValueError, match="at least 2"):
        vicreg_loss(np.ones((1, 3)), np.ones((1, 3)))


def test_cross_entropy_hand_computed():
    logits = np.array([[0.0, 0.0, np.log(2.0)], [1.0, 1.0, 1.0]])
    targets = np.array([2, 0])
    loss, dlogits, stats = cross_entropy(logits, targets)
    # row 0: softmax [1/4, 1/4, 1/2], -log(1/2); row 1: uniform over 3, -log(1/3)
    assert loss == pytest.approx((np.log(2) + np.log(3)) / 2, abs=1e-12)
    assert stats["ce"] == loss
    np.testing.assert_allclose(dlogits, [[0.125, 0.125, -0.25], [-1 / 3, 1 / 6, 1 / 6]], atol=1e-12)


def test_cross_entropy_gradient_and_no_overflow():
    rng = np.random.default_rng(1)
    logits, targets = 3 * rng.standard_normal((5, 7)), rng.integers(0, 7, size=5)
    loss = lambda: cross_entropy(logits, targets)[0]
    err = rel_err(cross_entropy(logits, targets)[1], numerical_grad(loss, logits))
    assert err < 1e-7, f"dlogits: relative error {err:.1e}"
    big = np.array([[1000.0, 0.0]], dtype=np.float32)      # exp(1000) overflows without the shift
    assert cross_entropy(big, np.array([1]))[0] == pytest.approx(1000.0)
