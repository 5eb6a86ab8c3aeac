"""Running the claims: each one measured, its verdict, and the results document (results.json, results.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vflsec.client.experiments.reproduce import luo, privee, rassouli, varasteh, ye
from vflsec.client.experiments.reproduce.claims import CLAIMS, KINDS, VERDICTS, Claim, Measurement
from vflsec.services.data import datasets

# Each paper's module registers its claims as it is imported; the registry keeps the papers in this order (the
# listing's, results.md's and `all`'s), whichever of them a process happened to import first.
PAPERS = (luo, rassouli, varasteh, privee, ye)


def _paper_rank(item: tuple[str, Claim]) -> int:
    measure = item[1].measure
    return [paper.__name__ for paper in PAPERS].index(getattr(measure, "func", measure).__module__)


_ordered = sorted(CLAIMS.items(), key=_paper_rank)  # stable: a paper's claims stay in the order it declares them
CLAIMS.clear()
CLAIMS.update(_ordered)


def missing_datasets(c: Claim) -> list[str]:
    found = datasets.available_datasets()
    return [name for name in c.datasets if name not in found]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def registered(c: Claim) -> dict[str, Any]:
    """What the registry says of a claim (``reproduce --list``; also the first keys of its row)."""
    return {"source": c.paper, "statement": c.statement, "paper": _jsonable(c.paper_value), "rule": c.rule,
            "kind": c.kind, "could_fail": c.could_fail, "runs": c.runs, "fast": c.fast, "datasets": list(c.datasets),
            "known_difference": c.known_difference}  # fmt: skip


# What a row must share with the registry to be this claim's measurement (the known difference's wording and the
# fast flag may change without re-measuring).
REGISTRATION = ("source", "statement", "paper", "rule", "kind", "could_fail", "runs", "datasets")


def same_registration(row: dict[str, Any], c: Claim) -> bool:
    expected = registered(c)
    return all(row.get(k) == expected[k] for k in REGISTRATION)


def listing() -> dict[str, Any]:
    """Every registered claim, in the order ``all`` runs them."""
    return {"claims": {name: registered(c) for name, c in CLAIMS.items()}}


def _loaded_commit() -> str:
    """The commit of the code this process loaded (``+dirty`` with uncommitted changes to the code;
    ``unknown`` outside a git checkout), read once at import: a later checkout does not change the code running."""
    import subprocess

    root = Path(__file__).resolve().parents[3]  # the checkout: client/experiments/reproduce/ is three below
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        code = ["client", "services", "proto", "pyproject.toml"]  # what measures (docs edits do not)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *code], cwd=root,
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


LOADED_COMMIT = _loaded_commit()


def measured_at() -> dict[str, str]:
    """The commit of the code that measured a row and the UTC time it was measured."""
    import datetime

    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return {"commit": LOADED_COMMIT, "date": now.isoformat().replace("+00:00", "Z")}


def _clear_caches() -> None:
    """Forget cached trainings so that each run of a several-run claim draws afresh."""
    for cached in (ye.ye_bank, ye.ye_drop):
        cached.cache_clear()


def _numbers(value: Any, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a measured value, by dotted key."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _numbers(sub, f"{prefix}{key}.").items()}
    if isinstance(value, bool) or not isinstance(value, int | float | np.number):
        return {}
    return {prefix.rstrip(".") or "value": float(value)}


def _spread_over_runs(measured: Sequence[Any]) -> dict[str, dict[str, float]]:
    per_key: dict[str, list[float]] = {}
    for m in measured:
        for key, v in _numbers(m).items():
            per_key.setdefault(key, []).append(v)
    return {k: {"min": min(v), "max": max(v), "mean": float(np.mean(v))} for k, v in per_key.items()}


def _verdict(m: Measurement) -> tuple[bool, str | None]:
    """A run reproduces when its rule holds and its check that it could have failed passed."""
    if not m.could_fail:
        return False, f"the check that the claim could fail did not pass: {m.reason}"
    return m.holds, m.reason


def run_claim(c: Claim) -> dict[str, Any]:
    """One claim's row: paper value, measured value, verdict (with the reason when it differs or is skipped), and
    the commit and date it was measured on. A claim of several runs: `measured` is the first run's, `per_run`
    every run's, `spread` the range of each figure, `reproduced_runs` how many reproduced."""
    # clarifications.md: per claim `paper` (the value), `measured`, `verdict`; the citation is `source`.
    row: dict[str, Any] = registered(c) | measured_at()
    missing = missing_datasets(c)
    if missing:
        folder = datasets.shared_datasets_dir()
        where = folder or f"no datasets folder (set {datasets.DATASETS_ENV_VAR})"
        reason = f"dataset {', '.join(missing)} not in {where}"
        return row | {"measured": None, "verdict": "skipped", "reason": reason, "reproduced_runs": 0}
    start = time.perf_counter()
    results: list[Measurement] = []
    try:
        for _ in range(c.runs):
            if c.runs > 1:
                _clear_caches()
            results.append(c.measure())
    except Exception as exc:  # one broken claim must not hide the others' results; reported, exit status 1
        return row | {"measured": None, "verdict": "error", "reason": f"{type(exc).__name__}: {exc}",
                      "reproduced_runs": 0, "seconds": time.perf_counter() - start}  # fmt: skip
    verdicts = [(bool(holds), reason) for holds, reason in map(_verdict, results)]  # numpy bools are not JSON
    reproduced = sum(holds for holds, _ in verdicts)
    first = results[0]
    row |= {"measured": _jsonable(first.measured), "verdict": "reproduced" if reproduced == c.runs else "differs"}
    if reproduced < c.runs:
        reason = next(r for holds, r in verdicts if not holds) or c.known_difference or "not known"
        if c.runs > 1:
            reason = f"reproduced in {reproduced} of {c.runs} runs; a run that differs: {reason}"
        row["reason"] = reason
    row["reproduced_runs"] = reproduced
    if c.runs > 1:
        pairs = zip(results, verdicts, strict=True)
        per_run = [{"measured": _jsonable(m.measured), "details": _jsonable(m.details), "reproduced": h}
                   for m, (h, _) in pairs]  # fmt: skip
        row |= {"spread": _spread_over_runs([m.measured for m in results]), "per_run": per_run}
    return row | {"details": _jsonable(first.details), "seconds": round(time.perf_counter() - start, 2)}


def select(name: str, fast: bool) -> list[Claim]:
    """``all`` (the fast subset with ``fast``) or one claim by name; ValueError naming the known claims."""
    if name == "all":
        return [c for c in CLAIMS.values() if c.fast or not fast]
    if name not in CLAIMS:
        raise ValueError(f"unknown claim {name!r}; known: all, {', '.join(CLAIMS)}")
    return [CLAIMS[name]]


def summarize(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The count per verdict (all rows), and per kind: attack claims and sanity checks apart."""
    def count(kind: str | None) -> dict[str, int]:
        return _all_counts({n: r for n, r in rows.items() if kind in (None, r.get("kind", "attack"))})

    return {"summary": count(None), "summary_by_kind": {k: count(k) for k in KINDS}}


def reproduce(claims: Sequence[Claim], on_claim: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every claim in turn; ONE document: per claim its row, then the count per verdict and the total time."""
    start = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    for c in claims:
        rows[c.name] = run_claim(c)
        if on_claim is not None:
            on_claim(c.name, rows[c.name])
    return {"claims": rows, **summarize(rows), "seconds": round(time.perf_counter() - start, 1)}


def merge(previous: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    """A published table updated with new rows: the claims just run replace theirs, every other registered claim
    keeps its row (with the commit and date it was measured on), claims no longer registered are dropped, and a
    registered claim never measured is listed as such. Rows in the registry's order."""
    old, new = previous.get("claims", {}), document["claims"]
    rows: dict[str, dict[str, Any]] = {}
    for name, c in CLAIMS.items():
        if name in new:
            rows[name] = new[name]
        elif name in old and same_registration(old[name], c):
            rows[name] = old[name]
        else:  # never measured, or its registration changed since: the old figures are not this claim's
            never = {"measured": None, "verdict": "not measured", "reason": "not measured at this commit"}
            rows[name] = registered(c) | never | {"commit": None, "date": None}
    return {"claims": rows, **summarize(rows), "seconds": round(sum(r.get("seconds") or 0 for r in rows.values()), 1)}


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_short(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return "—" if value is None else str(value)


def _count_line(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n) or "none"


def _all_counts(rows: dict[str, dict[str, Any]]) -> dict[str, int]:
    verdicts = [*VERDICTS, "not measured"]
    return {v: sum(r["verdict"] == v for r in rows.values()) for v in verdicts}


def count_sentence(document: dict[str, Any]) -> str:
    """The counts as docs quote them: attack claims and sanity checks apart."""
    by_kind = summarize(document["claims"])["summary_by_kind"]
    return f"attack claims: {_count_line(by_kind['attack'])}; sanity checks: {_count_line(by_kind['sanity'])}"


def markdown(document: dict[str, Any]) -> str:
    lines = ["# Reproduction of the seed papers' claims (`vflsec reproduce all`)", ""]
    lines += [f"Counts: {count_sentence(document)} (sanity checks test no attack: they check properties of the "
              "data and of the random draws that the attack claims lean on). "
              "Each row was measured on the commit and date it shows; a claim of several runs shows how many of "
              "its runs reproduced (the verdict is `reproduced` only when all did) and the spread of its figures.",
              ""]  # fmt: skip
    header = ["| claim | paper | paper value | measured | verdict | runs | reason | seconds | commit, date |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, title in (("attack", "Attack claims"), ("sanity", "Sanity checks")):
        lines += [f"## {title}", "", *header]
        for name, r in document["claims"].items():
            if r.get("kind", "attack") != kind:
                continue
            runs = f"{r['reproduced_runs']} of {r['runs']} reproduced" if "reproduced_runs" in r else "—"
            if r.get("spread"):
                runs += "; spread " + ", ".join(f"{k} {v['min']:.4g}–{v['max']:.4g}" for k, v in r["spread"].items())
            when = f"{(r.get('commit') or '—')[:12]}, {r.get('date') or '—'}"
            cells = [name, r["source"], _short(r["paper"]), _short(r["measured"]), f"**{r['verdict']}**", runs,
                     r.get("reason", ""), _short(r.get("seconds")), when]  # fmt: skip
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    lines += [f"All: {_count_line(document['summary'])}; {document['seconds']} s of measuring in all.", "",
              "## Each claim: statement, rule, how it could fail, details", ""]  # fmt: skip
    for name, r in document["claims"].items():
        details = f" Details: {_short(r['details'])}." if r.get("details") else ""
        could_fail = f" Could fail: {r['could_fail']}." if r.get("could_fail") else ""
        lines.append(f"* **{name}** ({r['source']}): {r['statement']}. Rule: {r['rule']}.{could_fail}{details}")
    return "\n".join(lines) + "\n"


def write(document: dict[str, Any], out: Path) -> list[Path]:
    """results.json and results.md in ``out``, always the whole registry (:func:`merge`): an existing results.json
    there is updated, so a claim measured alone joins the table beside the others' earlier rows, and a claim not
    yet measured is listed as such."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    document = merge(json.loads(paths[0].read_text()) if paths[0].exists() else {}, document)
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(markdown(document))
    return paths
