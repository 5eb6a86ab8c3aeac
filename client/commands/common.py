"""What the commands share: the one-line refusal (exit 2), the launcher's spec from the options, the defaults that
follow other options, and the progress lines and bars of the long commands."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from vflsec.client import options as opt

if TYPE_CHECKING:
    from vflsec.client.federation.launcher import FederationSpec


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def refused() -> Iterator[None]:
    """A spec the system would refuse (FederationSpec's validation, the minimum batch): the validator's message
    and exit 2, before any process starts. A party process that stops at start (its shard or defense refused): the
    end of its log, which says why, and exit 2; the log's path only if it is still there (a temporary folder is
    gone by now)."""
    from vflsec.client.federation.launcher import PartyExited, SpecError

    try:
        yield
    except SpecError as exc:
        fail(str(exc))
    except PartyExited as exc:
        log = exc.log_file if exc.log_file is not None and exc.log_file.exists() else "its log"
        fail(f"{exc.party} exited during start-up" + (f"; the end of {log}:\n{exc.tail}" if exc.tail else ""))


def federation_spec(
    dataset: str, release: list[str] | None = None, param_release: list[str] | None = None, **fields: Any
) -> FederationSpec:
    """The one option bag for the launcher, from what a command collected."""
    from vflsec.client.federation.launcher import FederationSpec

    with refused():
        return FederationSpec(dataset, score_release=release or (), param_release=param_release or (), **fields)


def spec_of(federation: opt.Federation, **fields: Any) -> FederationSpec:
    """The launcher's spec from a command's federation options (``fields`` for the command's own choices)."""
    from vflsec.client.federation.launcher import FederationSpec

    with refused():
        return FederationSpec(**(federation.spec_fields() | fields))


def data_notes(spec: FederationSpec, console) -> None:  # type: ignore[no-untyped-def]
    """Load the dataset (a one-line error, exit 2, if it cannot be used) and warn of what loading decided."""
    with refused():
        notes = spec.data.notes
    for note in notes:
        console.print(f"warning: {spec.name}: {note}", markup=False, soft_wrap=True)


def backend_for(ctx: typer.Context, backend: str, model: str, topology: str, console) -> str:  # type: ignore[no-untyped-def]
    """The default backend follows the topology: active-top sends z_B in the clear, so it has only the plain one
    (an explicit --backend ckks is refused by the spec with the reason)."""
    source = ctx.get_parameter_source("backend")  # typer's own click: compared by name, not imported
    if model == "splitnn" and topology == "active-top" and source is not None and source.name == "DEFAULT":
        if backend != "plain":
            note = "note: --topology active-top runs on the plain backend (z_B reaches the active party in clear)"
            console.print(note, markup=False)
        return "plain"
    return backend


def scaling_within_bound(ctx: typer.Context, spec: FederationSpec, console) -> FederationSpec:  # type: ignore[no-untyped-def]
    """A default scaling never trips the parties' feature bound: standard scaling of a rare category (Bank's
    ``default=yes``, 3 rows) reaches |x| ~ 117, so the default falls back to min-max and says so; an explicit
    --scaling keeps its clear error from write_federation."""
    from vflsec.services.crypto import he

    source = ctx.get_parameter_source("scaling")
    if source is None or source.name != "DEFAULT" or spec.scaling == "minmax":
        return spec
    with refused():
        peak = spec.scaled_peak()
    if peak <= he.FEATURE_BOUND:
        return spec
    console.print(
        f"note: standard scaling would reach |x| = {peak:.4g} > {he.FEATURE_BOUND:g} (the parties' bound); "
        "scaling min-max instead",
        markup=False,
    )
    return dataclasses.replace(spec, scaling="minmax")


def epochs_for(ctx: typer.Context, epochs: int, model: str, console) -> int:  # type: ignore[no-untyped-def]
    """A tree or forest is grown once: the default epochs follow that bound (an explicit other value is refused by
    the spec, which names the bound)."""
    source = ctx.get_parameter_source("epochs")
    if model in ("tree", "forest") and source is not None and source.name == "DEFAULT":
        console.print(f"note: a {model} is grown once over its training rows: epochs 1", markup=False)
        return 1
    return epochs



@contextlib.contextmanager
def progress_bars(console, as_json: bool) -> Iterator[tuple[Any, Callable[[str], None], Any]]:  # type: ignore[no-untyped-def]
    """The long commands' progress: one line per phase (and per attack) everywhere, piped output included (on
    stderr with --json), and bars in a terminal. Yields the bars, the line printer and the timed phases."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vflsec.client.federation.demo import Phases

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json or not console.is_terminal,  # bars in a terminal; the phase lines everywhere
    ) as bar:

        def log(line: str) -> None:  # phase lines print above the bars
            bar.console.print(line, markup=False)

        @contextlib.contextmanager
        def phase_bar(what: str, total: int | None) -> Iterator[Callable[..., None]]:
            task = bar.add_task(what, total=total)  # None: a pulse and the elapsed time until it ends
            counted = [total]

            def advance(n: int, new_total: int | None = None) -> None:
                if new_total is not None and new_total != counted[0]:
                    counted[0] = new_total
                    bar.update(task, total=new_total)
                bar.advance(task, n)

            yield advance
            if counted[0] is None:  # no counts to keep: its phase line says how long it took
                bar.remove_task(task)
            else:
                bar.update(task, completed=counted[0])

        yield bar, log, Phases(log, phase_bar)


def print_early_stopping(result: dict, console) -> None:  # type: ignore[no-untyped-def]
    """The early-stopping line of a demo or attack report that asked for it."""
    if "early_stopping" in result:
        from vflsec.client.federation.training import TrainingRecord

        console.print(TrainingRecord.from_dict(result["early_stopping"]).summary())

