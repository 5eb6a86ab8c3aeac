"""Attacks that stay in the feasible set S_F = {x ∈ [0, 1]^d : A x = b} (rassouli §IV–V).

* ``cls``  — box-constrained least squares, batched accelerated projected gradient;
* ``rcc2`` — rassouli Prop. 3: the point of S_F nearest to ½·1, a strictly concave QP in the null-space
  coordinates u (x = A⁺b + W u), solved for all samples at once through its r-dimensional dual;
* ``rcc1`` — rassouli Prop. 2: Eldar–Beck–Teboulle's SDP relaxation of the Chebyshev centre (cvxpy).

Rassouli's pitfalls, handled identically by rcc1/rcc2:

* *Rank tolerance.* rank(A) and Null(A) are taken from singular values above a relative tolerance
  (``models.lr.RANK_RTOL``); with an exact rank test, round-off makes A look full rank and the null space
  vanishes.
* *Empty null space* (A has full column rank, e.g. d_p ≤ C − 1): S is the single point A⁺b, so both
  estimates are LS itself — RCC1 solves no SDP, RCC2's projection converges in one Newton step.
* *Infeasible S_F.* Defended scores (noise, rounding, PRIVEE) usually give a plane A x = b that misses the
  cube; the QP/SDP then has no solution. Those samples fall back to Half* clipped to the cube (still the
  best-worst guess inside S given the evidence), and ``meta["feasible"]`` records which samples did.
* *Boundary features.* A feature at exactly 0 or 1 puts A⁺b on the cube's face up to round-off, which would
  make S_F "infeasible" by 1e-15: RCC2 accepts an equation residual up to ``tol``, RCC1 widens the cube by
  ``box_tol`` before solving; both clip the answer.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from vflsec.services.models.lr import PassiveSystem

from .base import register
from .closed_form import LinearSystemAttack

log = logging.getLogger(__name__)


def _accept(
    system: PassiveSystem, b: np.ndarray, x: np.ndarray, solved: np.ndarray, violation_tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """Keep solved samples that landed in the cube (up to solver accuracy); the rest get clipped Half*.

    A sample whose plane misses the cube cannot satisfy the box: its violation stays far above tolerance.
    """
    violation = np.maximum(np.max(-x, axis=1), np.max(x - 1.0, axis=1)) if x.size else np.zeros(len(x))
    feasible = solved & (violation <= violation_tol)
    fallback = np.clip(system.half_star(b), 0.0, 1.0)
    return np.where(feasible[:, None], np.clip(x, 0.0, 1.0), fallback), feasible


class Cls(LinearSystemAttack):
    """x̂ ∈ argmin_{x ∈ [0,1]^d} ‖A x − b‖² by FISTA from ½·1 (rassouli §IV), run to a residual tolerance.

    The minimiser is not unique when d_p > rank(A) (any point of S_F is one); starting at the cube's
    centre makes the answer deterministic and, like rassouli's GIA remark, centre-biased.
    A sample stops when its optimality residual ‖x − clip(x − ∇/L)‖_∞ (zero exactly at a minimiser) falls
    below ``tol``; the gradient-based adaptive restart (O'Donoghue–Candès) keeps ill-conditioned A (digits,
    d_p = 14) from stalling. Samples still above ``tol`` after ``max_iter`` are reported in
    ``meta["converged"]`` / ``meta["kkt_residual"]``, never silently.
    """

    def __init__(self, max_iter: int = 200_000, tol: float = 1e-9) -> None:
        self.max_iter = max_iter
        self.tol = tol

    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        x, converged, kkt, iterations = box_least_squares(system.a, b, self.max_iter, self.tol)
        residual = np.linalg.norm(x @ system.a.T - b, axis=1)
        return x, {"iterations": iterations, "residual": residual, "converged": converged, "kkt_residual": kkt}


def box_least_squares(
    a: np.ndarray, b: np.ndarray, max_iter: int = 200_000, tol: float = 1e-9
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """FISTA with adaptive restart for min_{x ∈ [0,1]^d} ‖A x − b_i‖² per row b_i, from ½·1.

    Returns (x, converged, optimality residual, iterations per sample).
    """
    n, d = b.shape[0], a.shape[1]
    x = np.full((n, d), 0.5)
    iterations = np.zeros(n, dtype=int)
    lipschitz = float(np.linalg.norm(a, 2) ** 2) if a.size else 0.0
    if lipschitz == 0.0:
        return x, np.ones(n, dtype=bool), np.zeros(n), iterations

    def step(points: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        return np.clip(points - ((points @ a.T - rhs) @ a) / lipschitz, 0.0, 1.0)

    def kkt(points: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        return np.max(np.abs(points - step(points, rhs)), axis=1) if d else np.zeros(len(points))

    active = np.arange(n)
    y, t = x.copy(), np.ones(n)
    residual = kkt(x, b)
    for iteration in range(1, max_iter + 1):
        active = active[residual[active] > tol]
        if active.size == 0:
            break
        xa, ya, ta, ba = x[active], y[active], t[active], b[active]
        x_new = step(ya, ba)
        restart = np.sum((ya - x_new) * (x_new - xa), axis=1) > 0  # momentum points uphill: drop it
        t_new = np.where(restart, 1.0, 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * ta * ta)))
        momentum = np.where(restart, 0.0, (ta - 1.0) / t_new)
        y[active] = x_new + momentum[:, None] * (x_new - xa)
        x[active], t[active] = x_new, t_new
        iterations[active] = iteration
        if iteration % 10 == 0 or iteration == max_iter:
            residual[active] = kkt(x_new, ba)
    residual = kkt(x, b)
    return x, residual <= tol, residual, iterations


class Rcc2(LinearSystemAttack):
    """RCC2 (rassouli Prop. 3): u* = argmax 1ᵀW u − ‖u‖² s.t. −q ≤ W u ≤ 1 − q; x̂ = q + W u*, q = A⁺b.

    By Remark 2 this is the projection of ½·1 onto S_F. The QP is solved through its Lagrange dual on the
    r = rank(A) orthonormal equations V_rᵀ x = V_rᵀ q that pin x − q to the null space (the rows of V_rᵀ are
    the complement of W's columns, so the tolerance-based rank is respected and the system is perfectly
    conditioned). For multipliers ν the box-constrained minimiser is x(ν) = clip(½·1 − V_r ν, 0, 1); the
    dual is concave and piecewise quadratic, so a semismooth Newton ascent with Armijo backtracking solves it
    exactly in a handful of steps — batched over samples, with r ≤ C − 1 unknowns per sample.
    A sample whose dual gradient (the equation residual) does not vanish has an empty S_F.
    """

    def __init__(self, max_iter: int = 100, tol: float = 1e-10, violation_tol: float = 1e-7) -> None:
        self.max_iter = max_iter
        self.tol = tol
        self.violation_tol = violation_tol

    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        q = system.least_squares(b)
        x, solved, iterations = project_half_onto_feasible_set(system, q, self.max_iter, self.tol)
        x, feasible = _accept(system, b, x, solved, self.violation_tol)
        return x, {"feasible": feasible, "iterations": iterations}


def project_half_onto_feasible_set(
    system: PassiveSystem, q: np.ndarray, max_iter: int = 100, tol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray, int]:
    """argmin_{x ∈ S_F} ‖x − ½·1‖ per sample (rows of q = A⁺b); the mask says which S_F were non-empty."""
    if system.rank == 0:  # A = 0 carries no information: S_F is the whole cube
        return np.full_like(q, 0.5), np.ones(len(q), dtype=bool), 0
    v = system.row_basis
    return project_box_affine(np.full(system.d, 0.5), v, q @ v, max_iter, tol)


def project_box_affine(
    c: np.ndarray, v: np.ndarray, p: np.ndarray, max_iter: int, tol: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """argmin_{x ∈ [0,1]^d, Vᵀx = p_i} ‖x − c‖² for every row p_i of p; V (d, r) has orthonormal columns.

    Returns (x, converged per sample, iterations). Dual ascent θ(ν) = ½‖x(ν) − c‖² + νᵀ(Vᵀx(ν) − p).
    """
    n, r = p.shape
    nu = np.zeros((n, r))

    def primal(nu_: np.ndarray) -> np.ndarray:
        return np.clip(c - nu_ @ v.T, 0.0, 1.0)

    def dual_value(nu_: np.ndarray, x_: np.ndarray, p_: np.ndarray) -> np.ndarray:
        return 0.5 * np.sum((x_ - c) ** 2, axis=1) + np.sum(nu_ * (x_ @ v - p_), axis=1)

    x = primal(nu)
    grad = x @ v - p
    converged = np.max(np.abs(grad), axis=1) <= tol
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - reported in meta
        active = np.flatnonzero(~converged)
        if active.size == 0:
            break
        nu_a, x_a, g_a, p_a = nu[active], x[active], grad[active], p[active]
        free = ((x_a > 0.0) & (x_a < 1.0)).astype(float)
        # Generalised Hessian of −θ is Vᵀ D V (D = free coordinates); the ridge handles directions with no
        # free coordinate, along which θ is linear (and unbounded when S_F is empty).
        hess = np.einsum("jr,nj,js->nrs", v, free, v) + 1e-12 * np.eye(r)
        step = np.linalg.solve(hess, g_a[:, :, None])[:, :, 0]
        base = dual_value(nu_a, x_a, p_a)
        slope = np.sum(g_a * step, axis=1)
        scale = np.ones(active.size)
        pending = np.ones(active.size, dtype=bool)
        for _ in range(40):  # Armijo backtracking, vectorised over the samples still pending
            trial_nu = nu_a + scale[:, None] * step
            trial_x = primal(trial_nu)
            ok = dual_value(trial_nu, trial_x, p_a) >= base + 1e-4 * scale * slope - 1e-14 * np.abs(base)
            newly = pending & ok
            nu_a[newly], x_a[newly] = trial_nu[newly], trial_x[newly]
            pending &= ~ok
            if not pending.any():
                break
            scale[pending] *= 0.5
        nu[active], x[active] = nu_a, x_a
        grad[active] = x_a @ v - p_a
        converged[active] = np.max(np.abs(grad[active]), axis=1) <= tol
    return x, converged, iterations


class Rcc1(LinearSystemAttack):
    """RCC1 (rassouli Prop. 2): the SDP-relaxed Chebyshev centre of S_F, one small SDP per sample.

    In the null-space coordinates each double-sided box row −q_i ≤ a_iᵀu ≤ 1 − q_i becomes the quadratic
    uᵀQ_i u + 2g_iᵀu + t_i ≤ 0 with Q_i = a_i a_iᵀ, g_i = (q_i − ½) a_i, t_i = −q_i(1 − q_i) (the quadratic
    form gives a smaller minimax value than two half-spaces). Eq. (16) as an SDP via the Schur complement:

        min_{α ≥ 0, τ}  τ − Σ α_i t_i   s.t.  [[Q(α), g(α)], [g(α)ᵀ, τ]] ⪰ 0,  Q(α) ⪰ I,

    and u = −Q(α)⁻¹ g(α). The problem is compiled once with cvxpy parameters (DPP) and re-solved per sample
    with Clarabel; an ``optimal_inaccurate`` answer is kept when its iterate satisfies the constraints to 1e-6
    (``meta["inaccurate"]`` marks those samples); SCS is the fallback solver for the rest, and a sample neither
    solves goes to the Half* fallback, as
    does a sample whose S_F is empty (detected beforehand by the exact projection of :class:`Rcc2`).
    """

    def __init__(
        self,
        solver: str = "CLARABEL",
        fallback_solver: str = "SCS",
        box_tol: float = 1e-9,
        violation_tol: float = 1e-4,
    ) -> None:
        self.solver = solver
        self.fallback_solver = fallback_solver
        self.box_tol = box_tol
        # x = q − W Q(α)⁻¹g(α) amplifies the interior-point solver's ~1e-8 accuracy to ~1e-6.
        self.violation_tol = violation_tol

    def solve(self, system: PassiveSystem, b: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        q = system.least_squares(b)
        w = system.null_basis
        n = q.shape[0]
        if w.shape[1] == 0:
            x, feasible = _accept(system, b, q, np.ones(n, dtype=bool), self.violation_tol)
            return x, {"feasible": feasible, "solver": np.full(n, None, dtype=object)}
        # S_F is empty exactly when RCC2's projection fails; skipping those samples spares the SDP solvers
        # their slow infeasibility certificates (SCS in particular).
        _, candidates, _ = project_half_onto_feasible_set(system, q)
        problem, alpha, gq_param, t_param = _rcc1_problem(w)
        # Widen the cube by box_tol (see module docstring): [−tol, 1 + tol] ⇒ shift q by tol, width 1 + 2 tol.
        q_shift = q + self.box_tol
        width = 1.0 + 2.0 * self.box_tol
        x = np.empty_like(q)
        solved = np.zeros(n, dtype=bool)
        solver_used = np.full(n, None, dtype=object)
        inaccurate = np.zeros(n, dtype=bool)  # optimal_inaccurate, accepted on its certified residuals
        for i in np.flatnonzero(candidates):
            gq_param.value = q_shift[i] - 0.5 * width
            t_param.value = -q_shift[i] * (width - q_shift[i])
            for solver in (self.solver, self.fallback_solver):
                status = self._try_solve(problem, solver)
                if status is not None:
                    a_opt = np.maximum(alpha.value, 0.0)
                    q_mat = (w.T * a_opt) @ w
                    g_vec = w.T @ (a_opt * gq_param.value)
                    x[i] = q[i] - w @ np.linalg.solve(q_mat, g_vec)
                    solved[i], solver_used[i] = True, solver
                    inaccurate[i] = status == "inaccurate"
                    break
        x, feasible = _accept(system, b, np.where(solved[:, None], x, 0.0), solved, self.violation_tol)
        return x, {"feasible": feasible, "solver": solver_used, "inaccurate": inaccurate}

    @staticmethod
    def _try_solve(problem: Any, solver: str, psd_tol: float = 1e-6) -> str | None:
        """Solve; an ``optimal_inaccurate`` answer counts when its iterate is certified by hand: α ≥ 0 and both
        matrix inequalities hold to ``psd_tol`` (Clarabel stops there on ill-conditioned W, e.g. digits at
        d_p = 30, with an answer that is right to ~1e-8; falling back to SCS was slower and less accurate)."""
        import cvxpy as cp  # imported lazily: only RCC1 needs a conic solver, and cvxpy takes ~1 s to load

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                problem.solve(solver=solver)
        except cp.error.SolverError as exc:
            log.debug("rcc1: %s failed: %s", solver, exc)
            return None
        if problem.status == cp.OPTIMAL:
            return "optimal"
        if (
            problem.status == cp.OPTIMAL_INACCURATE
            and all(v.value is not None for v in problem.variables())
            and max(_psd_violation(c) for c in problem.constraints) <= psd_tol
        ):
            return "inaccurate"
        log.debug("rcc1: %s returned %s", solver, problem.status)
        return None


def _psd_violation(constraint: Any) -> float:
    """How far a cvxpy constraint's current value is from holding (largest negative eigenvalue for ⪰ 0)."""
    import cvxpy as cp

    if isinstance(constraint, cp.constraints.PSD):
        value = np.asarray(constraint.expr.value, dtype=float)
        return max(0.0, -float(np.linalg.eigvalsh(0.5 * (value + value.T)).min()))
    return float(np.max(constraint.violation(), initial=0.0))


def _rcc1_problem(w: np.ndarray) -> tuple[Any, Any, Any, Any]:
    """The parametrised SDP of Eq. (16) for null basis W; parameters are (q − ½) and t per sample."""
    import cvxpy as cp  # lazily, see Rcc1._try_solve

    d, k = w.shape
    alpha = cp.Variable(d, nonneg=True)
    tau = cp.Variable((1, 1))
    gq = cp.Parameter(d)
    t = cp.Parameter(d)
    q_mat = w.T @ cp.diag(alpha) @ w
    g_vec = cp.reshape(w.T @ cp.multiply(alpha, gq), (k, 1), order="F")
    block = cp.bmat([[q_mat, g_vec], [g_vec.T, tau]])
    constraints = [0.5 * (block + block.T) >> 0, 0.5 * (q_mat + q_mat.T) >> np.eye(k)]
    problem = cp.Problem(cp.Minimize(tau[0, 0] - t @ alpha), constraints)
    return problem, alpha, gq, t


register("cls", Cls)
register("rcc2", Rcc2)
register("rcc1", Rcc1)
