"""Assemble a party from its config: load its data, connect its peers, start its server."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflsec.services import plugins, registry
from vflsec.services.config import ServiceConfig, StatisticsPolicy
from vflsec.services.crypto import he
from vflsec.services.data import datasets
from vflsec.services.defenses.release import (
    ParamReleaseChain,
    ReleaseConfigError,
    ScoreReleaseChain,
    served_families,
)
from vflsec.services.engines import checkpoint
from vflsec.services.models import family as families
from vflsec.services.transport.links import CoordinatorClient, PassiveClient
from vflsec.services.transport.server import (
    CallPolicy,
    RunningServer,
    peer_channel,
    serve_forever,
    start_server,
    tls_files,
)
from vflsec.v1 import active_pb2_grpc, coordinator_pb2_grpc, splitnn_pb2_grpc, tree_pb2_grpc


@dataclass
class Party:
    """A running party: its engine (plain Python), its server and the channels it opened."""

    config: ServiceConfig
    engine: Any
    server: RunningServer
    channels: list[grpc.Channel] = field(default_factory=list)
    hub: plugins.PluginHub | None = None
    state: checkpoint.StateDir | None = None

    @property
    def address(self) -> str:
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()
        for channel in self.channels:
            channel.close()
        if self.hub is not None:
            self.hub.close()
        if self.state is not None:
            self.state.release()


def load_party_data(config: ServiceConfig, state: checkpoint.StateDir | None = None) -> datasets.PartyData:
    """The party's shard, its columns scaled; ``state`` (a passive party's) keeps the scaling under masquerade."""
    assert config.data is not None
    data = datasets.read_party_csv(config.data.path)
    if config.data.columns:
        missing = sorted(set(config.data.columns) - set(data.columns))
        if missing:
            raise ValueError(f"{config.data.path}: no column(s) {missing}")
        keep = [data.columns.index(c) for c in config.data.columns]
        data = replace(data, X=data.X[:, keep], columns=list(config.data.columns))
    # Each party scales only its own columns, locally; min-max to [0, 1] is what the attacks assume.
    masquerade = any(registry.parse_spec(spec)[0] == "masquerade" for spec in config.embedding_release)
    scaler = party_scaler(data.X, data.columns, config.data.scaling, state, keep=masquerade, source=config.data.path)
    return replace(data, X=scaler.transform(data.X))


def party_scaler(
    X: np.ndarray,
    columns: list[str],
    kind: datasets.ScalerKind,
    state: checkpoint.StateDir | None,
    *,
    keep: bool,
    source: Path | str = "the shard",
) -> datasets.Scaler:
    """The scaler of a party's shard: fitted on it, or with ``keep`` and a state folder fitted at the first start and
    kept beside the secrets (``masquerade_columns`` = [kind, *columns], ``masquerade_scaling`` = [offset; scale]).

    Masquerade's Q is fixed in scaled units: a refit (rows added) or another column order would make it another
    projection of the raw rows, and sessions before and after, stacked, span more than either (review 8b). A scaling
    that takes a feature past FEATURE_BOUND is refused (ValueError naming ``source``), before it is kept."""
    kept_here = keep and state is not None and state.path is not None

    def bounded(scaler: datasets.Scaler, kept: bool = False) -> datasets.Scaler:
        scaled = scaler.transform(X)
        if not np.all(np.abs(scaled) <= he.FEATURE_BOUND):
            # Gradient masks hide |δ·x| <= FEATURE_BOUND only; a larger raw feature would show through them.
            way_out = (
                "rows added since the first start lie that far outside the scaling kept then "
                "(secrets/masquerade_scaling.npy): leave them out, or remove the kept masquerade files (a refit: "
                "sessions after it, stacked with earlier ones, span x again)"
                if kept
                else "use minmax or standard scaling"
            )
            raise ValueError(
                f"{source}: features after scaling = {kind!r} reach |x| = {np.abs(scaled).max():.4g}; the masks hide "
                f"|x| <= {he.FEATURE_BOUND:g}: {way_out}"
            )
        return scaler

    if not kept_here:
        return bounded(datasets.Scaler.fit(X, kind))
    assert state is not None
    configured = [kind, *columns]

    def same_columns(kept: np.ndarray) -> str | None:
        if kept.ndim == 1 and kept.tolist() == configured:
            return None
        was = kept.tolist() if kept.ndim == 1 and kept.size else ["?"]
        return (
            f"masquerade's Q was drawn for scaling = {was[0]!r} over the columns {was[1:]}, the config gives scaling "
            f"= {kind!r} over {columns}: restore [data] scaling and columns (removing the kept masquerade files "
            "refits: sessions after that, stacked with earlier ones, span x again)"
        )

    def first_fit() -> np.ndarray:
        scaler = bounded(datasets.Scaler.fit(X, kind))
        return np.stack([scaler.offset, scaler.scale])

    def unusable(kept: np.ndarray) -> str | None:
        fits = kept.shape == (2, len(columns)) and kept.dtype.kind == "f" and np.isfinite(kept).all()
        return None if fits and (kept[1] >= 0).all() else f"not a finite [offset; scale] of {len(columns)} columns"

    # The kept columns are checked first, and both arrays written only once the first fit passed the bound: a start
    # refused there (e.g. scaling = "none") keeps nothing, and the operator's corrected scaling is the one kept.
    state.long_term_array("masquerade_columns", None, same_columns)
    kept = state.long_term_array("masquerade_scaling", first_fit, unusable)
    state.long_term_array("masquerade_columns", lambda: np.array(configured, dtype=str), same_columns)
    assert kept is not None
    return bounded(datasets.Scaler(kind, kept[0], kept[1]), kept=True)


def _channel(config: ServiceConfig, peer: str) -> grpc.Channel:
    try:
        address = config.peers[peer]
    except KeyError:
        raise ValueError(f"{config.party_id}: no address for peer {peer!r} in [peers]") from None
    return peer_channel(address, peer, tls_files(config.tls), config.max_message_bytes)


def start_party(config: ServiceConfig) -> Party:
    # One process per state folder, claimed before anything in it is read or swept (checkpoint.StateDir).
    state = checkpoint.StateDir(config.state_dir, exclusive=True)
    try:
        party = _start(config, state)
    except BaseException:
        state.release()
        raise
    party.state = state
    return party


def _start(config: ServiceConfig, state: checkpoint.StateDir) -> Party:
    policy = CallPolicy(timeout=config.call_timeout, retry_seconds=config.retry_seconds)
    # Each role imports only its own engine: a coordinator or active process never loads the passive engine's
    # split-NN defenses (torch, ~3 CPU-s of start-up).
    if config.role == "coordinator":
        from vflsec.services.engines import coordinator
        from vflsec.services.rpc import coordinator as coordinator_rpc
        from vflsec.services.rpc import splitnn, trees

        channels = {party: _channel(config, party) for party in config.passive_peers}
        clients = {party: PassiveClient(party, ch, policy) for party, ch in channels.items()}

        # One coordinator serves every family: OpenSession checks the chains against the session's family (a step
        # that does not support it refuses the session, naming it); a chain that serves no family refuses to start.
        score_chain = ScoreReleaseChain.from_specs(config.score_release)
        param_chain = ParamReleaseChain.from_specs(config.param_release)
        if not served_families(score_chain, param_chain, list(families.PACKAGES)):
            raise ReleaseConfigError(
                "no model family supports every step of the release chains "
                f"({', '.join([*config.score_release, *config.param_release])})"
            )
        engine = coordinator.Coordinator(
            score_chain,
            param_chain,
            clients,
            policy=coordinator.QueryPolicy(config.query_budget, config.refuse_training_ids, config.max_query_rows),
            state=state,
            schema=config.schema,
            allowed_backends=config.allowed_backends,
            key_rotation_steps=config.key_rotation_steps or None,
            max_rows=config.psi_max_ids,
            statistics=StatisticsPolicy(config.min_training_rows, config.min_node_rows),
        )

        def add_coordinator(s: grpc.Server) -> None:
            coordinator_pb2_grpc.add_CoordinatorServicer_to_server(coordinator_rpc.CoordinatorServicer(engine), s)
            splitnn_pb2_grpc.add_SplitNnCoordinatorServicer_to_server(splitnn.SplitNnCoordinatorServicer(engine), s)
            tree_pb2_grpc.add_TreeCoordinatorServicer_to_server(trees.TreeCoordinatorServicer(engine), s)

        server = start_server(
            config,
            add_coordinator,
            {
                "vflsec.v1.Coordinator": coordinator_rpc.ROLE_POLICY,
                "vflsec.v1.SplitNnCoordinator": splitnn.COORDINATOR_POLICY,
                "vflsec.v1.TreeCoordinator": trees.COORDINATOR_POLICY,
            },
        )
        return Party(config, engine, server, list(channels.values()))

    if config.role == "passive":
        from vflsec.services.engines import passive
        from vflsec.services.rpc import passive as passive_rpc
        from vflsec.services.rpc import splitnn, trees

        channel = _channel(config, "coordinator")
        engine = passive.PassiveParty(
            config.party_id,
            load_party_data(config, state),
            CoordinatorClient(channel, policy),
            state,
            config.operator,
            psi_max_ids=config.psi_max_ids,
            psi_max_ratio=config.psi_max_ratio,
            psi_ratio_floor=config.psi_ratio_floor,
            psi_owner_budget=config.psi_owner_budget,
            psi_accept=config.psi_accept,
            allowed_backends=config.allowed_backends,
            embedding_release=config.embedding_release,
            min_training_rows=config.min_training_rows,
            min_node_rows=config.min_node_rows,
            hub=plugins.PluginHub([plugins.load_plugin(p.path, p.options) for p in config.plugins]),
        )

        def add_passive(s: grpc.Server) -> None:
            passive_rpc.add_to_server(passive_rpc.PassiveServicer(engine, config.max_message_bytes), s)
            splitnn_pb2_grpc.add_SplitNnPassiveServicer_to_server(splitnn.SplitNnPassiveServicer(engine), s)
            tree_pb2_grpc.add_TreePassiveServicer_to_server(trees.TreePassiveServicer(engine), s)

        server = start_server(
            config,
            add_passive,
            {
                "vflsec.v1.Passive": passive_rpc.ROLE_POLICY,
                "vflsec.v1.SplitNnPassive": splitnn.PASSIVE_POLICY,
                "vflsec.v1.TreePassive": trees.PASSIVE_POLICY,
            },
        )
        return Party(config, engine, server, [channel], engine.hub)

    from vflsec.services.engines import active
    from vflsec.services.rpc import active as active_rpc

    data = load_party_data(config)
    coordinator_channel = _channel(config, "coordinator")
    passive_channels = {party: _channel(config, party) for party in sorted(config.passive_peers)}
    hub = plugins.PluginHub([plugins.load_plugin(p.path, p.options) for p in config.plugins])
    engine = active.ActiveParty(
        config.party_id,
        data,
        list(data.class_names or []),
        CoordinatorClient(coordinator_channel, policy),
        {party: PassiveClient(party, ch, policy) for party, ch in passive_channels.items()},
        hub,
        state,
        psi_max_ids=config.psi_max_ids,
        psi_max_ratio=config.psi_max_ratio,
        psi_ratio_floor=config.psi_ratio_floor,
        psi_protocol=config.psi_protocol,
        predict_window_ms=config.predict_window_ms,
        predict_batch_rows=config.predict_batch_rows,
    )
    server = start_server(
        config,
        lambda s: active_pb2_grpc.add_ActiveServicer_to_server(active_rpc.ActiveServicer(engine), s),
        {"vflsec.v1.Active": active_rpc.ROLE_POLICY},
    )
    return Party(config, engine, server, [coordinator_channel, *passive_channels.values()], hub)


# glibc's heaps (arenas) a party's threads share: by default every thread that allocates while another does gets one
# of its own, up to 8 per core, and each keeps the memory its temporaries freed. Two took the PSI's share of a
# party's peak RSS at 1M from 123-148 MB to 87-93 MB at the same CPU (docs/performance.md, "Bounded memory").
MALLOC_ARENAS = 2


def _bound_malloc_arenas() -> None:
    """At most MALLOC_ARENAS glibc arenas from here on, unless $MALLOC_ARENA_MAX chose (glibc reads it itself)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not a C library with mallopt: its own allocator's defaults
        return
    mallopt(_M_ARENA_MAX, MALLOC_ARENAS)


_M_ARENA_MAX = -8  # glibc's malloc.h


def serve(config: ServiceConfig) -> None:
    _bound_malloc_arenas()  # before the server's threads allocate
    party = start_party(config)
    print(f"{config.role} {config.party_id} serving on {party.address}", flush=True)
    serve_forever(party.server, on_stop=party.stop)
