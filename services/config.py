"""Service configuration: one TOML file per party (``vflsec serve ROLE --config FILE``).

Relative paths in a config file are resolved against the file's folder, so a party's folder (config, data,
certificates) can be moved or mounted as a whole.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vflsec.services.crypto.psi import MAX_IDS as PSI_MAX_IDS
from vflsec.services.crypto.psi import MAX_RATIO as PSI_MAX_RATIO
from vflsec.services.crypto.psi import PROTOCOLS as PSI_PROTOCOLS
from vflsec.services.crypto.psi import RATIO_FLOOR as PSI_RATIO_FLOOR

# Default query budget (scored samples per owner, over all its sessions): finite, and far above what a demo,
# `vflsec attack` or an experiment scores (the largest, bench he's inference on 30,000 rows, scores 30,000 per run).
QUERY_BUDGET = 10_000_000

# Default per-owner PSI budget: ten exchanges of the largest size, far above any demo, test or bench run.
PSI_OWNER_BUDGET = 10 * PSI_MAX_IDS

ROLES = ("coordinator", "active", "passive")

# Rule 3 (docs/protocol.md, "Statistics come from enough rows"): defaults every shipped dataset meets (wine's 142
# training rows; a 4-row leaf moves depth-5 trees by < 1 pp on wine and digits, docs/trees.md).
MIN_TRAINING_ROWS = 32
MIN_NODE_ROWS = 4
# Active party: concurrent Predicts of a session share one round (services/engines/batching.py): a round gathers until
# no Predict has joined it for this long, at most 5 times this long ([limits] predict_window_ms; 0: every Predict its
# own round), and carries at most this many rows ([limits] predict_batch_rows; a larger request runs alone, in chunks)
PREDICT_WINDOW_MS = 2.0
PREDICT_BATCH_ROWS = 4096
ACTIVE_WORKERS = 64  # the active party's server threads by default ([limits] workers; other roles: 16)


@dataclass(frozen=True)
class StatisticsPolicy:
    """``[policy] min_training_rows`` / ``min_node_rows``: the rows a disclosed statistic is computed over, at least.

    A party fits what it discloses (a tree's bins) on at least ``min_training_rows`` rows of its own shard and a
    session trains on at least that many; no node of fewer than ``min_node_rows`` (weighted) rows is split off, so
    no count or threshold anyone sees comes from fewer rows."""

    min_training_rows: int = MIN_TRAINING_ROWS
    min_node_rows: int = MIN_NODE_ROWS

    def __post_init__(self) -> None:
        if self.min_training_rows < 2 or self.min_node_rows < 1:
            raise ValueError(
                f"[policy] min_training_rows must be >= 2 and min_node_rows >= 1, got {self.min_training_rows} "
                f"and {self.min_node_rows}"
            )


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class TlsConfig:
    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class DataConfig:
    path: Path
    columns: tuple[str, ...] = ()  # empty: every feature column of the file
    scaling: str = "minmax"  # minmax | standard | none


@dataclass(frozen=True)
class PluginConfig:
    path: str  # "package.module:Class" or an entry point name in group vflsec.plugins
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceConfig:
    role: str
    party_id: str
    listen: str
    tls: TlsConfig
    peers: dict[str, str] = field(default_factory=dict)  # party id -> host:port
    data: DataConfig | None = None
    score_release: tuple[str, ...] = ()
    param_release: tuple[str, ...] = ()
    # Passive party: its own defenses of the output it sends in the clear (split-NN active-top), e.g.
    # ["masquerade:m=16"] ([defenses] embedding; services/defenses/embeddings.py). Parsed when the party starts.
    embedding_release: tuple[str, ...] = ()
    plugins: tuple[PluginConfig, ...] = ()
    max_message_bytes: int = 256 * 1024 * 1024
    workers: int = 16
    # Active party: concurrent Predicts of a session share a round ([limits] predict_window_ms, how long a round waits
    # for the next Predict to join, 0: no batching; predict_batch_rows, the most rows a round carries)
    predict_window_ms: float = PREDICT_WINDOW_MS
    predict_batch_rows: int = PREDICT_BATCH_ROWS
    state_dir: Path | None = None  # session checkpoints; None keeps sessions in memory only
    retry_seconds: float = 60.0  # how long calls to a peer are retried while it is UNAVAILABLE
    call_timeout: float = 600.0  # deadline of one call to a peer
    # Coordinator query policy: scored samples per owner (0 = unlimited, only when set so), training-ID refusal,
    # rows/request.
    query_budget: int = QUERY_BUDGET
    refuse_training_ids: bool = False
    max_query_rows: int = 100_000
    # Coordinator and passive parties: rows a disclosed statistic is computed over, at least ([policy]; rule 3).
    min_training_rows: int = MIN_TRAINING_ROWS
    min_node_rows: int = MIN_NODE_ROWS
    psi_max_ids: int = PSI_MAX_IDS  # IDs one PSI exchange may carry (the other side's list, and our own)
    psi_max_ratio: float = PSI_MAX_RATIO  # the other side's list may hold up to this many times our own IDs
    psi_ratio_floor: int = PSI_RATIO_FLOOR  # ... or up to this many IDs, whatever our own size
    # Passive party: IDs it blinds for one owner over all sessions and restarts ([limits] psi_owner_budget).
    psi_owner_budget: int = PSI_OWNER_BUDGET
    # Active party: the alignment protocol ([psi] protocol): "oprf" (OT extension, the default) or "ecdh".
    psi_protocol: str = PSI_PROTOCOLS[0]
    # Passive party: the protocols it serves ([psi] accept; default both). ["ecdh"] refuses the OPRF hello.
    psi_accept: tuple[str, ...] = PSI_PROTOCOLS
    # Passive party: the operator identity allowed to ask it for a risk forecast (None: operator-<party_id>).
    operator: str | None = None
    # Coordinator: the operator-approved feature columns of each party ([schema], party id -> count; the active
    # party's block adds its bias column). Required: widths are never self-declared. None for other roles.
    schema: dict[str, int] | None = None
    # Coordinator: at most this many steps per training key ([limits] key_rotation_steps; 0: the bound derived
    # from [schema], he.key_rotation_steps). It can only make keys rotate more often.
    key_rotation_steps: int = 0
    # Coordinator and passive parties: the HE backends a session may run on ([policy] allowed_backends); plain
    # hides nothing. The coordinator refuses others at OpenSession (and at restore), a passive party at JoinSession.
    allowed_backends: tuple[str, ...] = ("ckks",)

    @property
    def passive_peers(self) -> dict[str, str]:
        return {party: addr for party, addr in self.peers.items() if party.startswith("passive")}


def load_config(path: str | Path, role: str | None = None) -> ServiceConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    return parse_config(raw, base=path.parent, role=role, source=str(path))


def parse_config(raw: dict[str, Any], *, base: Path, role: str | None = None, source: str = "config") -> ServiceConfig:
    def need(table: dict[str, Any], key: str, where: str) -> Any:
        if key not in table:
            raise ConfigError(f"{source}: missing '{key}' in {where}")
        return table[key]

    def resolve(value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else (base / p)

    cfg_role = raw.get("role", role)
    if cfg_role not in ROLES:
        raise ConfigError(f"{source}: role must be one of {ROLES}, got {cfg_role!r}")
    if role is not None and cfg_role != role:
        raise ConfigError(f"{source}: file is for role {cfg_role!r}, but {role!r} was asked for")
    tls_raw = need(raw, "tls", "the file")
    tls = TlsConfig(*(resolve(need(tls_raw, k, "[tls]")) for k in ("ca", "cert", "key")))
    data = None
    if "data" in raw:
        d = raw["data"]
        data = DataConfig(
            path=resolve(need(d, "path", "[data]")),
            columns=tuple(d.get("columns", ())),
            scaling=d.get("scaling", "minmax"),
        )
        if data.scaling not in ("minmax", "standard", "none"):
            raise ConfigError(f"{source}: [data] scaling must be minmax, standard or none")
    if cfg_role in ("active", "passive") and data is None:
        raise ConfigError(f"{source}: a {cfg_role} party needs a [data] table")
    release = raw.get("release", {})
    embedding = raw.get("defenses", {}).get("embedding", [])
    if not isinstance(embedding, list) or not all(isinstance(spec, str) for spec in embedding):
        raise ConfigError(f'{source}: [defenses] embedding is a list of specs such as "masquerade:m=16"')
    if embedding and cfg_role != "passive":
        raise ConfigError(f"{source}: [defenses] embedding is a passive party's own defense, not a {cfg_role}'s")
    plugins = tuple(
        PluginConfig(path=need(p, "path", "[[plugins]]"), options=dict(p.get("options", {})))
        for p in raw.get("plugins", ())
    )
    limits = raw.get("limits", {})
    psi_max_ids = int(limits.get("psi_max_ids", PSI_MAX_IDS))
    if psi_max_ids < 1:
        raise ConfigError(f"{source}: [limits] psi_max_ids must be >= 1, got {psi_max_ids}")
    psi_max_ratio = float(limits.get("psi_max_ratio", PSI_MAX_RATIO))
    if not psi_max_ratio > 0:
        raise ConfigError(f"{source}: [limits] psi_max_ratio must be > 0, got {psi_max_ratio}")
    psi_ratio_floor = int(limits.get("psi_ratio_floor", PSI_RATIO_FLOOR))
    if psi_ratio_floor < 0:
        raise ConfigError(f"{source}: [limits] psi_ratio_floor must be >= 0, got {psi_ratio_floor}")
    key_rotation_steps = int(limits.get("key_rotation_steps", 0))
    if key_rotation_steps < 0:
        raise ConfigError(f"{source}: [limits] key_rotation_steps must be >= 0, got {key_rotation_steps}")
    predict_window_ms = float(limits.get("predict_window_ms", PREDICT_WINDOW_MS))
    if not 0 <= predict_window_ms <= 1000:
        raise ConfigError(
            f"{source}: [limits] predict_window_ms must be in [0, 1000] (0: no batching), got {predict_window_ms}"
        )
    predict_batch_rows = int(limits.get("predict_batch_rows", PREDICT_BATCH_ROWS))
    if predict_batch_rows < 1:
        raise ConfigError(f"{source}: [limits] predict_batch_rows must be >= 1, got {predict_batch_rows}")
    psi_owner_budget = int(limits.get("psi_owner_budget", PSI_OWNER_BUDGET))
    if psi_owner_budget < 1:
        raise ConfigError(f"{source}: [limits] psi_owner_budget must be >= 1, got {psi_owner_budget}")
    psi_protocol = raw.get("psi", {}).get("protocol", PSI_PROTOCOLS[0])
    if psi_protocol not in PSI_PROTOCOLS:
        raise ConfigError(f"{source}: [psi] protocol must be one of {', '.join(PSI_PROTOCOLS)}, got {psi_protocol!r}")
    psi_accept = raw.get("psi", {}).get("accept", list(PSI_PROTOCOLS))
    if (
        not isinstance(psi_accept, list)
        or not psi_accept
        or any(not isinstance(p, str) or p not in PSI_PROTOCOLS for p in psi_accept)
    ):
        raise ConfigError(
            f"{source}: [psi] accept must be a non-empty list of {', '.join(PSI_PROTOCOLS)}, got {psi_accept!r}"
        )
    policy = raw.get("policy", {})
    state = raw.get("state", {})
    schema = raw.get("schema")
    if cfg_role == "coordinator" and schema is None:
        raise ConfigError(
            f"{source}: a coordinator needs a [schema] table (party id -> its operator-approved number of feature "
            "columns): block widths are never self-declared"
        )
    if schema is not None:
        if not isinstance(schema, dict) or not all(type(v) is int and v >= 1 for v in schema.values()):
            raise ConfigError(f"{source}: [schema] maps each party id to its number of feature columns (>= 1)")
        schema = dict(schema)
    allowed_backends = policy.get("allowed_backends", ["ckks"])
    if not isinstance(allowed_backends, list) or not set(allowed_backends) <= {"ckks", "plain"}:
        raise ConfigError(
            f"{source}: [policy] allowed_backends is a list of 'ckks' and 'plain', got {allowed_backends!r}"
        )
    query_budget = int(policy.get("query_budget", QUERY_BUDGET))
    if query_budget < 0:
        raise ConfigError(f"{source}: [policy] query_budget must be >= 0 (0: unlimited), got {query_budget}")
    try:
        statistics = StatisticsPolicy(
            int(policy.get("min_training_rows", MIN_TRAINING_ROWS)), int(policy.get("min_node_rows", MIN_NODE_ROWS))
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return ServiceConfig(
        role=cfg_role,
        party_id=need(raw, "party_id", "the file"),
        listen=need(raw, "listen", "the file"),
        tls=tls,
        peers=dict(raw.get("peers", {})),
        data=data,
        score_release=tuple(release.get("scores", ())),
        param_release=tuple(release.get("params", ())),
        embedding_release=tuple(embedding),
        plugins=plugins,
        max_message_bytes=int(limits.get("max_message_mb", 256)) * 1024 * 1024,
        # The active party's Predicts wait in a shared round (PREDICT_WINDOW_MS): a round gathers at most as many
        # requests as the server has threads, so it has more by default.
        workers=int(limits.get("workers", ACTIVE_WORKERS if cfg_role == "active" else 16)),
        predict_window_ms=predict_window_ms,
        predict_batch_rows=predict_batch_rows,
        # A top-level ``seed`` (older configs) is ignored: every release-time draw reads OS entropy.
        state_dir=resolve(state["dir"]) if "dir" in state else None,
        retry_seconds=float(limits.get("retry_seconds", 60.0)),
        call_timeout=float(limits.get("call_timeout", 600.0)),
        query_budget=query_budget,
        min_training_rows=statistics.min_training_rows,
        min_node_rows=statistics.min_node_rows,
        refuse_training_ids=bool(policy.get("refuse_training_ids", False)),
        max_query_rows=int(policy.get("max_query_rows", 100_000)),
        psi_max_ids=psi_max_ids,
        psi_max_ratio=psi_max_ratio,
        psi_ratio_floor=psi_ratio_floor,
        psi_owner_budget=psi_owner_budget,
        psi_protocol=psi_protocol,
        psi_accept=tuple(psi_accept),
        key_rotation_steps=key_rotation_steps,
        operator=raw.get("operator"),
        schema=schema,
        allowed_backends=tuple(allowed_backends),
    )


def dump_toml(raw: dict[str, Any]) -> str:
    """Write the small subset of TOML our configs use (tables, arrays of tables, scalars, lists)."""
    lines: list[str] = []

    def scalar(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str | Path):
            return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list | tuple):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f'"{k}" = {scalar(x)}' for k, x in v.items()) + " }"
        raise TypeError(f"cannot write {type(v).__name__} to TOML")

    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in raw.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
    for key, value in raw.items():
        if key not in tables and key not in arrays and value is not None:
            lines.append(f"{key} = {scalar(value)}")
    for key, table in tables.items():
        lines.append(f"\n[{key}]")
        lines.extend(f'"{k}" = {scalar(v)}' for k, v in table.items())
    for key, items in arrays.items():
        for item in items:
            lines.append(f"\n[[{key}]]")
            lines.extend(f'"{k}" = {scalar(v)}' for k, v in item.items())
    return "\n".join(lines) + "\n"
