"""rassouli et al.'s claims (RG against Half, Theorem 1's ordering, Theorem 2's closed forms, the sign-only
attack)."""

from __future__ import annotations

import numpy as np

from vflsec.client.experiments.reproduce.claims import THEOREM1_MARGIN, Measurement, attack_mse, claim, uci_task
from vflsec.services.attacks import Observations, make_attack, mse, run_attack
from vflsec.services.attacks.synthetic import trained_lr_task


@claim(
    paper="rassouli Lemma 1",
    statement="MSE(RG) − MSE(Half) = Var(U) = 1/12 for any data distribution",
    paper_value=1 / 12,
    rule="|gap − 1/12| ≤ 0.005 on digits' held-out rows (26 passive columns; RG the mean of 10 fresh draws)",
    kind="sanity",
    could_fail="RG drawn from another law than U(0,1) (or not fresh) moves the gap off 1/12",
    fast=True,
)
def rg_minus_half() -> Measurement:
    task = trained_lr_task("digits")
    gap = np.mean([attack_mse(task, "rg", seed=None) for _ in range(10)]) - attack_mse(task, "half")  # 10 fresh draws
    return Measurement(gap, abs(gap - 1 / 12) <= 0.005)


@claim(
    paper="rassouli Thm 1",
    statement="per sample, ‖X − x̂_RCC2‖ ≤ ‖X − x̂_Half*‖ ≤ ‖X − ½·1‖ (exact scores)",
    paper_value={"share of samples": 1.0},
    rule="every held-out row of breast_cancer, wine and digits (LR, 40 % passive) satisfies both, to 1e-9; judged "
    f"only when RCC2 beats Half by ≥ {THEOREM1_MARGIN:.0%} of Half's MSE on each dataset",
    could_fail="attacks that all returned ½·1 satisfy the ordering with equality; the margin over Half refuses that",
    fast=True,
)
def theorem1_ordering() -> Measurement:
    shares, mses = {}, {}
    for dataset in ("breast_cancer", "wine", "digits"):
        task = trained_lr_task(dataset)
        estimates = {n: run_attack(make_attack(n), task.obs).x_passive for n in ("rcc2", "half_star", "half")}
        dist = {n: np.linalg.norm(task.x_passive - x, axis=1) for n, x in estimates.items()}
        ok = (dist["rcc2"] <= dist["half_star"] + 1e-9) & (dist["half_star"] <= dist["half"] + 1e-9)
        shares[dataset] = float(ok.mean())
        mses[dataset] = {n: mse(task.x_passive, x) for n, x in estimates.items()}
    worst = min(shares.values())
    beats = {k: 1 - m["rcc2"] / m["half"] for k, m in mses.items()}  # RCC2's advantage over Half, per dataset
    could_fail = min(beats.values()) >= THEOREM1_MARGIN
    reason = None
    if not could_fail:
        reason = f"RCC2 beats Half by {min(beats.values()):.1%} < {THEOREM1_MARGIN:.0%}: the ordering says nothing"
    return Measurement({"share of samples": worst}, worst == 1.0, {"share": shares, "mse": mses,
                       "rcc2_advantage_over_half": beats}, reason, could_fail)  # fmt: skip


@claim(
    paper="rassouli Thm 2",
    statement="MSE(LS) = Tr((I − A⁺A) K_0)/d and MSE(Half*) = Tr((I − A⁺A) K_½)/d",
    paper_value="closed form = measured",
    rule="the closed form with K_0, K_½ of the training rows matches the attacks' MSE on the held-out rows within "
    "3 standard errors of the difference of the two means (breast_cancer, wine, digits; LR, 40 % passive)",
    could_fail="the two closed forms differ from each other and from Half's MSE, so an attack returning the wrong "
    "estimate (Half, LS for Half*) misses its own form; judged only when each form is > 3 standard errors from "
    "Half's MSE on at least two of the three datasets (where Half would match a form, that case says nothing: "
    "details z_half)",
    fast=True,
)
def closed_form_mse() -> Measurement:
    from vflsec.services.attacks.linear import passive_system

    rows: dict[str, dict[str, float]] = {}
    worst, informative = 0.0, {"ls": 0, "half_star": 0}  # per form: the datasets where Half misses it
    for dataset in ("breast_cancer", "wine", "digits"):
        task = trained_lr_task(dataset)
        system, _ = passive_system(task.obs)
        null = system.null_basis @ system.null_basis.T  # I − A⁺A
        x_train, d = task.train_x_passive, task.obs.d_passive
        assert x_train is not None
        for name, centre in (("ls", 0.0), ("half_star", 0.5)):
            # Tr((I − A⁺A) K)/d is the mean over the training rows of (x − c)ᵀ(I − A⁺A)(x − c)/d.
            form = np.einsum("ij,jk,ik->i", x_train - centre, null, x_train - centre) / d
            x_hat = run_attack(make_attack(name), task.obs).x_passive
            errors = np.mean((task.x_passive - x_hat) ** 2, axis=1)
            se = np.sqrt(form.var(ddof=1) / len(form) + errors.var(ddof=1) / len(errors))
            z = abs(errors.mean() - form.mean()) / se
            half = np.mean((task.x_passive - 0.5) ** 2, axis=1)  # what an attack that learned nothing scores
            se_half = np.sqrt(form.var(ddof=1) / len(form) + half.var(ddof=1) / len(half))
            z_half = abs(half.mean() - form.mean()) / se_half
            worst, informative[name] = max(worst, z), informative[name] + int(z_half > 3.0)
            rows[f"{dataset} {name}"] = {"predicted": form.mean(), "measured": errors.mean(), "z": z, "z_half": z_half}
    could_fail = min(informative.values()) >= 2
    reason = None if could_fail else f"Half's MSE is > 3 standard errors from a form on only {informative} datasets"
    return Measurement({"largest |z|": worst}, worst <= 3.0, rows, reason, could_fail)


@claim(
    paper="rassouli §VI, Fig. 7",
    statement="black box, the passive party holds emp.var.rate of Bank: knowing only the sign of ω·b, the "
    "sign-only attack's MSE → 0 as the number of predictions N grows",
    paper_value={"N=100": "≈ 0 (Fig. 7)"},
    rule="mean MSE over 100 draws of N held-out predictions decreases for N = 10, 100, 1000 and is < 0.01 at 1000",
    could_fail="< 0.01 at N = 1000 is far below Half's MSE on the column (details: half); judged only when it is "
    "below a tenth of Half's",
    datasets=("bank",),
)
def sign_only_bank() -> Measurement:
    task = uci_task("bank", "target", ["emp.var.rate"], n_query=5000).task
    obs = task.obs
    w, b = float(obs.w_passive[0, 0]), float(obs.bias[0])  # type: ignore[index]
    relation = "same" if w * b > 0 else "opposite"  # the adversary's one piece of knowledge
    attack = make_attack("sign_only", sign_relation=relation)
    rng = np.random.default_rng()
    curve = {}
    for n in (10, 100, 1000):
        errors = []
        for _ in range(100):
            rows = rng.choice(obs.n_samples, size=n, replace=False)
            seen = Observations(obs.x_active[rows], obs.scores[rows], obs.n_classes, 1, w_active=obs.w_active)  # type: ignore[index]
            errors.append(mse(task.x_passive[rows], run_attack(attack, seen).x_passive))
        curve[f"N={n}"] = float(np.mean(errors))
    values, half = list(curve.values()), attack_mse(task, "half")
    holds = values[0] > values[1] > values[2] and values[2] < 0.01
    could_fail = 0.1 * half >= 0.01
    reason = None if could_fail else f"Half's MSE on the column is {half:.4f}: the 0.01 bound is no test"
    return Measurement(curve, holds, {"omega": w, "b": b, "sign_relation": relation, "half": half}, reason, could_fail)
