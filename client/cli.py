"""The ``vflsec`` command line: the commands of client/commands/ assembled in one typer app (``main`` is the
console script; ``python -m vflsec.client.cli`` runs it too)."""

from __future__ import annotations

import sys

import typer

from vflsec.client.commands import attack, bench, catalog, certs, experiments, federation, party

app = typer.Typer(
    help="vflsec: vertical federated learning with measured privacy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Click's plain help: option names and defaults stay whole in an 80-column terminal (rich's table cuts them).
    rich_markup_mode=None,
)
# In the order `vflsec --help` lists them.
app.add_typer(bench.app, name="bench")
app.command()(party.serve)
app.add_typer(certs.app, name="certs")
app.command()(federation.demo)
app.command()(federation.prepare)
app.command()(federation.run)
app.command()(party.health)
app.command()(attack.attack)
app.command()(federation.risk)
app.command()(experiments.curve)
app.command()(experiments.experiment)
app.command(cls=experiments.ClaimsHelp)(experiments.reproduce)
app.add_typer(catalog.attacks_app, name="attacks")
app.add_typer(catalog.defenses_app, name="defenses")
app.add_typer(catalog.datasets_app, name="datasets")


def main() -> None:
    from vflsec.client.federation.launcher import Stopped, stop_on_signals

    try:
        with stop_on_signals():
            app()
    except Stopped as stop:  # the parties are stopped and the temporary folders gone by now: say so, exit 128 + n
        done = "; ".join(stop.cleaned) or "nothing was running"
        sys.stderr.write(f"stopped by {signal_name(stop.signum)}: {done}\n")
        raise SystemExit(128 + stop.signum) from None


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


if __name__ == "__main__":
    main()
