"""The command line as Python functions, for notebooks: each takes the CLI command's options as keyword arguments
(its parameter names: ``dataset="wine"``, ``release=["privee:epsilon=1"]``, ``withhold_model=True``) and returns the
dict that the command prints with ``--json``. Progress lines go to stderr as in a terminal; a user mistake raises
:class:`VflsecError` with the CLI's one-line message.

    from vflsec import api
    report = api.attack(dataset="wine", backend="plain", attacks="esa,half_star")
    api.frame(report)          # the attacks as a pandas DataFrame (pandas installed)

``api.options("attack")`` lists a command's keyword arguments; ``vflsec COMMAND --help`` says what each does.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

__all__ = ["VflsecError", "attack", "demo", "experiment", "frame", "options", "reproduce"]


class VflsecError(ValueError):
    """The command refused its options or its input (the CLI's exit 2), or failed; the message is the CLI's."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _command(name: str) -> Any:
    """The click command behind ``vflsec NAME`` (typer's own click: read through its attributes only)."""
    from vflsec.client.cli import app

    command = typer.main.get_command(app).commands.get(name)  # type: ignore[attr-defined]
    if command is None:
        raise ValueError(f"no command {name!r}")
    return command


def options(command: str) -> dict[str, Any]:
    """A command's keyword arguments and their defaults (``json`` is always on and not listed)."""
    return {p.name: p.default for p in _command(command).params if p.name and p.name != "as_json"}


def _arguments(command: Any, kwargs: dict[str, Any]) -> list[str]:
    """The command line of ``kwargs``: options by their long names, flags on or off, lists repeated."""
    params = {p.name: p for p in command.params if p.name}
    unknown = sorted(set(kwargs) - set(params) - {"as_json"})
    if unknown:
        accepted = ", ".join(n for n in params if n != "as_json")
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; accepted: {accepted}")
    positional: list[str] = []
    args: list[str] = []
    for key, value in kwargs.items():
        param = params[key]
        if value is None or key == "as_json":
            continue
        if param.param_type_name == "argument":
            positional.append(str(value))
            continue
        if param.is_flag:
            if value:
                args.append(param.opts[0])
            elif param.secondary_opts:
                args.append(param.secondary_opts[0])
            continue
        values = value if isinstance(value, list | tuple) and param.multiple else [value]
        for v in values:
            args += [param.opts[0], ",".join(map(str, v)) if isinstance(v, list | tuple) else str(v)]
    return [*positional, *args]


def _run(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``vflsec NAME ... --json`` in this process; its last stdout line is the result."""
    from vflsec.client.federation.launcher import Stopped, stop_on_signals

    command = _command(name)
    args = [*_arguments(command, kwargs), "--json"]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        with contextlib.redirect_stdout(out), _stderr_tee(err), stop_on_signals():
            try:
                # Not standalone: click returns an Exit's code (the CLI's one-line refusals exit 2) instead of exiting.
                code = command.main(args, prog_name=f"vflsec {name}", standalone_mode=False) or 0
            except Exception as exc:  # click's usage errors (a bad option value), as the CLI would print them
                if not hasattr(exc, "format_message"):
                    raise
                raise VflsecError(exc.format_message(), getattr(exc, "exit_code", 2)) from None
    except typer.Exit as exc:
        code = exc.exit_code
    except Stopped as stop:
        raise KeyboardInterrupt(f"stopped by {stop}: {'; '.join(stop.cleaned)}") from None
    lines = out.getvalue().strip().splitlines()
    if code or not lines:
        errors = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
        message = errors[-1].removeprefix("error: ") if errors else err.getvalue().strip()[-500:]
        raise VflsecError(message or f"vflsec {name} exited with {code}", code or 1)
    return json.loads(lines[-1])


@contextlib.contextmanager
def _stderr_tee(copy: io.StringIO):  # type: ignore[no-untyped-def]
    """stderr shown as usual (the progress lines) and kept (the error line, for the exception's message)."""
    import sys

    class Tee(io.TextIOBase):
        def __init__(self, target: Any) -> None:
            self.target = target

        def write(self, text: str) -> int:
            copy.write(text)
            return self.target.write(text)

        def flush(self) -> None:
            self.target.flush()

        def isatty(self) -> bool:
            return False

    with contextlib.redirect_stderr(Tee(sys.stderr)):
        yield


def attack(**kwargs: Any) -> dict[str, Any]:
    """``vflsec attack``: train through the real services with the curious active party, attack its recordings; the
    report (``attacks.<name>.mse``, ``baselines``, ``strongest``, ``undefended`` under a release chain, ...)."""
    return _run("attack", kwargs)


def demo(**kwargs: Any) -> dict[str, Any]:
    """``vflsec demo``: a federation of processes, aligned, trained and evaluated; accuracy and timings."""
    return _run("demo", kwargs)


def experiment(scenario_file: str | Path, **kwargs: Any) -> dict[str, Any]:
    """``vflsec experiment SCENARIO.yaml``: every cell of the scenario; the summary of results.json."""
    return _run("experiment", {"scenario_file": scenario_file, **kwargs})


def reproduce(claim: str = "all", **kwargs: Any) -> dict[str, Any]:
    """``vflsec reproduce``: the papers' claims, paper value beside ours and a verdict per claim."""
    return _run("reproduce", {"claim": claim, **kwargs})


def frame(report: dict[str, Any], what: str = "attacks") -> Any:
    """A report's per-attack rows (``what="attacks"``; baselines included, marked) or an experiment's or reproduction's
    rows (``"rows"``, ``"claims"``) as a pandas DataFrame. Needs pandas (``pip install pandas``)."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("vflsec.api.frame needs pandas: pip install pandas") from exc
    if what == "attacks" and report.get("attacker", "active") != "active":  # a passive party's label attacks
        rows = [{"attack": n, "kind": "baseline", n: v} for n, v in report["baselines"].items()]
        rows += [
            {"attack": n, "kind": "labels", **{k: v for k, v in r.items() if not isinstance(v, dict)}}
            for n, r in report["attacks"].items()
        ]
        return pd.DataFrame(rows).set_index("attack")
    if what == "attacks":
        rows = [{"attack": n, "kind": "baseline", "mse_clipped": v, "mse": v} for n, v in report["baselines"].items()]
        for name, r in report["attacks"].items():
            kind = "aware" if r.get("aware") else "naive"
            rows.append({"attack": name, "kind": kind, **{k: v for k, v in r.items() if not isinstance(v, dict)}})
        return pd.DataFrame(rows).set_index("attack")
    value = report[what]
    return pd.DataFrame(value if isinstance(value, Sequence) else [{"name": k, **v} for k, v in value.items()])
