"""Split-NN protocol steps: the gradients the parties exchange equal torch autograd's on the central model; the
masked shares keep every h_p hidden from the key holder; state round-trips; bad input is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vflsec.services.crypto import entropy, ring_mask
from vflsec.services.models import splitnn as sn
from vflsec.services.models.splitnn.modules import DTYPE, CentralModel

SEED = 11
FEATURES = (4, 3, 5)  # active, passive 1, passive 2
N_CLASSES = 3
BATCH = 40


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def batch() -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    rng = np.random.default_rng(0)
    return tuple(rng.normal(size=(BATCH, d)) for d in FEATURES), rng.integers(0, N_CLASSES, BATCH)


def _config(topology: str, **kw: object) -> sn.SplitNNConfig:
    return sn.SplitNNConfig(topology, FEATURES, N_CLASSES, bottom_hidden=((6,), (), ()), **kw)


def _central_grads(config: sn.SplitNNConfig, blocks: tuple[np.ndarray, ...], y: np.ndarray):
    """Autograd on the central model: ∂L/∂(each bottom output) and every bottom parameter's gradient."""
    model = CentralModel(config, SEED)
    outputs = model.embeddings(torch.tensor(np.hstack(blocks), dtype=DTYPE))
    for out in outputs:
        out.retain_grad()
    combined = model.combine(outputs)
    combined.retain_grad()
    torch.nn.functional.cross_entropy(model.top(combined), torch.as_tensor(y)).backward()
    params = [[p.grad.numpy().copy() for p in bottom.parameters()] for bottom in model.bottoms]
    return combined.grad.numpy(), [o.grad.numpy() for o in outputs], params


def _shares(fed: sn.LocalFederation, h: dict[int, np.ndarray], step: int = 1) -> list[np.ndarray]:
    """Every party's share of a step as the services build them: the owner's first."""
    rows = np.arange(len(h[0]))
    nonce, width = entropy.new_nonce(), h[0].shape[1]
    masks = {p: ring_mask.embedding_mask(key, "s", step, nonce, rows, width) for p, key in fed.mask_keys.items()}
    own = ring_mask.encode(h[0])
    for mask in masks.values():
        own -= mask
    return [own, *(ring_mask.encode(h[p]) + masks[p] for p in sorted(masks))]


def test_coordinator_top_gradient_is_autograds(batch) -> None:
    blocks, y = batch
    config = _config("coordinator-top")
    fed = sn.LocalFederation.create(config, sn.OptimizerConfig(), SEED)
    h = {p: fed.bottoms[p].forward(blocks[p], train=True) for p in range(3)}
    opened = sn.open_masked(_shares(fed, h))
    np.testing.assert_allclose(opened, h[0] + h[1] + h[2], atol=3 * 2.0**-25)  # fixed point at 2^-24
    step = fed.head.train_step([opened], y)
    for p in range(3):
        fed.bottoms[p].backward(step.grads[0])

    grad_h, grad_outputs, params = _central_grads(config, blocks, y)
    atol = 1e-7  # the 2^-24 fixed point moves ∂L/∂h by ~1e-8 here
    np.testing.assert_allclose(step.grads[0], grad_h, atol=atol)
    for p in range(3):
        np.testing.assert_allclose(grad_outputs[p], grad_h, atol=1e-15)  # h = Σ h_p: one gradient for all
        for mine, central in zip((q.grad.numpy() for q in fed.bottoms[p].module.parameters()), params[p], strict=True):
            np.testing.assert_allclose(mine, central, atol=10 * atol)


def test_active_top_gradient_is_autograds(batch) -> None:
    blocks, y = batch
    config = _config("active-top", passive_bias=True)
    fed = sn.LocalFederation.create(config, sn.OptimizerConfig(), SEED)
    z = [fed.bottoms[p].forward(blocks[p], train=True) for p in (1, 2)]
    assert [zp.shape[1] for zp in z] == [8, 8]  # default width max(d_B, 8)
    step = fed.head.train_step(z, y, local=blocks[0])
    for p, grad in enumerate(step.grads, start=1):
        fed.bottoms[p].backward(grad)
    _, grad_outputs, params = _central_grads(config, blocks, y)
    for p in (1, 2):
        np.testing.assert_allclose(step.grads[p - 1], grad_outputs[p], atol=1e-15)
        for mine, central in zip((q.grad.numpy() for q in fed.bottoms[p].module.parameters()), params[p], strict=True):
            np.testing.assert_allclose(mine, central, atol=1e-15)


def test_no_share_but_the_whole_sum_says_anything_of_an_embedding(batch) -> None:
    """Each share alone, and every sum short of all of them, decodes to values unrelated to the parties' h (the masks
    are uniform words); only the sum of every share gives h."""
    blocks, _ = batch
    fed = sn.LocalFederation.create(_config("coordinator-top"), sn.OptimizerConfig(), SEED)
    h = {p: fed.bottoms[p].forward(blocks[p], train=False) for p in range(3)}
    shares = _shares(fed, h)
    for part in ([shares[1]], [shares[2]], [shares[0], shares[1]], [shares[0], shares[2]], [shares[1], shares[2]]):
        total = np.sum(part, axis=0, dtype=np.uint64)
        seen = ring_mask.decode(total)
        for p in range(3):
            assert abs(np.corrcoef(seen.ravel(), h[p].ravel())[0, 1]) < 0.2
        assert np.abs(seen).mean() > 1e6  # masked words decode to values of order 2^39, far from |h| ~ 1
    assert np.abs(sn.open_masked(shares) - (h[0] + h[1] + h[2])).max() < 2.0**-23


def test_key_holder_clips_a_crafted_share_and_never_refuses() -> None:
    """Rule 4: a share crafted to push h anywhere is trained on clipped to ±EMBEDDING_BOUND, not refused."""
    crafted = np.full((4, 16), np.uint64(2**62))
    h = sn.open_masked([crafted, ring_mask.encode(np.ones((4, 16)))])
    assert (np.abs(h) <= sn.EMBEDDING_BOUND).all() and (h == sn.EMBEDDING_BOUND).all()
    # Encoding refuses no value either: NaN is 0, beyond ±2^31 is clipped.
    assert ring_mask.decode(ring_mask.encode(np.array([np.nan, np.inf, -1e300, 2.5]))).tolist() == [
        0.0, 2.0**31, -(2.0**31), 2.5
    ]


@pytest.mark.parametrize("topology", sn.TOPOLOGIES)
def test_state_round_trip_continues_identically(batch, topology: str) -> None:
    blocks, y = batch
    config = _config(topology)
    optim = sn.OptimizerConfig("sgd", learning_rate=0.1, schedule="step", step_epochs=1)
    a, b = (sn.LocalFederation.create(config, optim, SEED) for _ in range(2))
    a.train_step(blocks, y)
    a.end_epoch()
    b.head = sn.Head.from_state(config, optim, a.head.to_state())
    b.bottoms = {p: sn.Bottom.from_state(config, p, optim, bottom.to_state()) for p, bottom in a.bottoms.items()}
    assert b.head.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # the schedule's epoch came along
    assert a.train_step(blocks, y) == b.train_step(blocks, y)
    np.testing.assert_array_equal(a.scores(blocks), b.scores(blocks))
    with pytest.raises(ValueError, match="does not fit"):
        sn.Bottom.from_state(config, 1, optim, a.head.to_state())
    with pytest.raises(ValueError, match="does not fit"):
        sn.Head.from_state(config, optim, b"not a checkpoint")


def test_steps_refuse_bad_input(batch) -> None:
    blocks, y = batch
    fed = sn.LocalFederation.create(_config("active-top"), sn.OptimizerConfig(), SEED)
    bottom, head = fed.bottoms[1], fed.head
    with pytest.raises(ValueError, match=r"shape \(batch >= 1, 3\)"):
        bottom.forward(blocks[2], train=True)
    with pytest.raises(ValueError, match="non-finite"):
        bottom.forward(np.full((2, 3), np.nan), train=True)
    with pytest.raises(ValueError, match="no training forward"):
        bottom.backward(np.zeros((BATCH, 8)))
    z = bottom.forward(blocks[1], train=True)
    with pytest.raises(ValueError, match="gradient must have shape"):
        bottom.backward(np.zeros((BATCH, 7)))
    with pytest.raises(ValueError, match="expected 2 received inputs"):
        head.train_step([z], y, local=blocks[0])
    with pytest.raises(ValueError, match="own rows"):
        head.train_step([z, z], y)
    with pytest.raises(ValueError, match="batch size"):
        head.train_step([z, z[:5]], y, local=blocks[0])
    with pytest.raises(ValueError, match=r"classes 0\.\.2"):
        head.train_step([z, z], np.full(BATCH, 3), local=blocks[0])


def test_seeded_construction_is_per_role() -> None:
    """A party building only its own bottom gets the central model's parameters for it; other seeds differ."""
    config = _config("coordinator-top")
    central = CentralModel(config, SEED)
    alone = sn.Bottom.create(config, 2, sn.OptimizerConfig(), SEED).module
    for mine, theirs in zip(alone.parameters(), central.bottoms[2].parameters(), strict=True):
        assert torch.equal(mine, theirs)
    other = sn.Bottom.create(config, 2, sn.OptimizerConfig(), SEED + 1).module
    assert not torch.equal(next(other.parameters()), next(alone.parameters()))


@pytest.mark.parametrize(
    "optim",
    [
        sn.OptimizerConfig("sgd", learning_rate=0.1, schedule="step", step_epochs=2, gamma=0.5),
        sn.OptimizerConfig("adam", learning_rate=0.1, schedule="cosine", epochs=5),
    ],
)
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # no training step here
def test_at_epoch_takes_the_rate_that_as_many_end_epochs_reach(optim: sn.OptimizerConfig) -> None:
    """The services name each step's epoch (docs/protocol.md): a role jumps to it, forwards or back (a new Train
    call starts at epoch 0), at the rate the in-process run reaches by stepping the schedule."""
    config = _config("coordinator-top")
    stepped, jumped = (sn.Head.create(config, optim, SEED) for _ in range(2))
    for epoch in [0, 1, 2, 3, 4, 5, 6]:
        jumped.at_epoch(epoch)
        assert jumped.optimizer.param_groups[0]["lr"] == pytest.approx(stepped.optimizer.param_groups[0]["lr"])
        assert jumped.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * optim.rate_factor(epoch))
        stepped.end_epoch()
    jumped.at_epoch(0)
    assert jumped.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
