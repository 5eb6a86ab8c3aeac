"""Accuracy after every epoch of the attack command's model (the evidence for attack's default epochs rule).

    .venv/bin/python benchmarks/epoch_curve.py [--dataset bank] [--backend plain] [--epochs 30]

The attack harness's federation (random:0.4 passive columns, 1,000 queried rows, the default batch), parties
in-process for plain (one process each for ckks); one Train call per epoch, then a Predict of the queried rows
and of every training row (the plain LR is exact: the same seed trains the same model as one Train call of
all epochs). Prints one line per epoch: its seconds, the accuracy on the queried and on the training rows.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from vflsec.client.experiments import harness, runs
from vflsec.client.federation.launcher import FederationSpec, write_federation
from vflsec.client.options import passive_features
from vflsec.services.data import datasets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="bank")
    parser.add_argument("--backend", default="plain")
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    spec = FederationSpec(
        args.dataset,
        passive_features=passive_features("random:0.4"),
        backend=args.backend,
        epochs=args.epochs,
        checkpoints=False,
    )
    scenario = harness.AttackScenario(spec, attacks=("esa",), predictions=1000, in_process=args.backend == "plain")
    plan, train_ids, _, queried, note = runs.session_plan(scenario)
    print(f"{args.dataset}: {len(train_ids)} training rows, batch {plan.batch_size} ({note})")
    labels = plan.data.y
    query_labels = labels[datasets.select_ids(plan.data.ids, queried)]
    train_labels = labels[datasets.select_ids(plan.data.ids, train_ids)]
    with tempfile.TemporaryDirectory() as tmp:
        layout = write_federation(runs.recording_spec(scenario, Path(tmp) / "c.sqlite"), Path(tmp) / "f")
        with runs.parties(scenario, layout) as operator:
            info = operator.create_session(plan.backend, **plan.session_options())
            start = time.perf_counter()
            operator.align(info.session_id)
            print(f"align {time.perf_counter() - start:.1f} s")
            for epoch in range(1, args.epochs + 1):
                start = time.perf_counter()
                for _ in operator.train(info.session_id, train_ids, 1):
                    pass
                seconds = time.perf_counter() - start
                on_query = np.mean(operator.predict(info.session_id, queried).scores.argmax(1) == query_labels)
                on_train = np.mean(operator.predict(info.session_id, train_ids).scores.argmax(1) == train_labels)
                print(f"epoch {epoch} {seconds:.2f} s query_acc {on_query:.4f} train_acc {on_train:.4f}", flush=True)


if __name__ == "__main__":  # the PSI pool's forkserver re-imports this module
    main()
