"""Bank marketing (41,188 rows) trains as a coordinator-top split-NN under real CKKS, within 1 pp of the central
model; skipped when ../shared/datasets is absent."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.services.data import datasets
from vflsec.services.models import splitnn as sn

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.datasets
@pytest.mark.skipif("bank" not in datasets.available_datasets(), reason="shared dataset 'bank' not found")
def test_bank_trains_federated() -> None:
    dataset = datasets.load_dataset("bank")
    data = sn.SplitData.from_dataset(dataset, n_passive=1, seed=0)
    config = sn.SplitNNConfig("coordinator-top", data.features, dataset.n_classes)
    optim = sn.OptimizerConfig("adam", learning_rate=0.01, weight_decay=1e-4)
    run = {"epochs": 2, "batch_size": 256, "seed": 1}
    central, _ = sn.central_run(config, optim, data, **run)
    federated, _ = sn.simulate(config, optim, data, **run)
    majority = float(np.mean(data.y_test == np.bincount(data.y_train).argmax()))
    assert central.accuracy > majority + 0.005  # the model learns something beyond the 88.7 % majority class
    assert abs(federated.accuracy - central.accuracy) <= 0.01
