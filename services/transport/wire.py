"""Encrypted matrices on the wire: ``he.EncryptedMatrix`` <-> ``vflsec.v1.EncryptedMatrix``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vflsec.services.common import digest as digest
from vflsec.services.common import require_distinct_rows as require_distinct_rows
from vflsec.services.crypto import he
from vflsec.services.defenses.release import ReleasedParams, StepDescription
from vflsec.services.errors import InvalidArgument, PeerFailed, ServiceError
from vflsec.services.models.family import Received, TrainingConfig
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import common_pb2, coordinator_pb2

# gRPC's status codes by name (services/errors.py names them; this module imports no gRPC)
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
STATUS_CODES = {name: code for code, name in enumerate(STATUS_NAMES)}

BACKENDS = {common_pb2.BACKEND_CKKS: "ckks", common_pb2.BACKEND_PLAIN: "plain"}
BACKEND_ENUM = {name: value for value, name in BACKENDS.items()}


def backend_name(value: int) -> str:
    try:
        return BACKENDS[value]
    except KeyError:
        raise InvalidArgument(f"backend must be BACKEND_CKKS or BACKEND_PLAIN, got {value}") from None


def to_message(backend: he.Backend, matrix: he.EncryptedMatrix) -> common_pb2.EncryptedMatrix:
    return message_of(he.matrix_to_wire(backend, matrix))


def message_of(w: he.WireMatrix) -> common_pb2.EncryptedMatrix:
    """The message of a serialised matrix (one serialisation, sent to several parties)."""
    rows, cols = w.shape
    return common_pb2.EncryptedMatrix(
        rows=rows, cols=cols, replicas=w.replicas, rows_per_ciphertext=w.rows_per_ct, ciphertexts=w.ciphertexts
    )


def unparsed(message: common_pb2.EncryptedMatrix) -> he.WireMatrix:
    """A matrix's serialised ciphertexts and layout, for a receiver that parses them under keys it fetches itself."""
    return he.WireMatrix(
        (message.rows, message.cols), message.replicas, message.rows_per_ciphertext, list(message.ciphertexts)
    )


def from_message(
    backend: he.Backend,
    message: common_pb2.EncryptedMatrix,
    name: str,
    *,
    rows: int | None = None,
    cols: int | None = None,
) -> he.EncryptedMatrix:
    """Validate the layout and deserialize every ciphertext; any defect is an InvalidArgument."""
    if rows is not None and message.rows != rows:
        raise InvalidArgument(f"{name}: expected {rows} rows, got {message.rows}")
    if cols is not None and message.cols != cols:
        raise InvalidArgument(f"{name}: expected {cols} columns, got {message.cols}")
    try:
        return he.matrix_from_wire(backend, unparsed(message))
    except ValueError as exc:
        raise InvalidArgument(f"{name}: {exc}") from exc


def received(
    backend: he.Backend, message: common_pb2.EncryptedMatrix, name: str, *, rows: int, cols: int
) -> Received:
    """A received matrix for a model family: validated and parsed, with its bytes and their fingerprint."""
    blobs = list(message.ciphertexts)
    return Received(from_message(backend, message, name, rows=rows, cols=cols), blobs, digest(blobs))


def training_config(message: common_pb2.TrainingConfig) -> TrainingConfig:
    """A TrainingConfig message as the plain settings the engines read (unset fields: "" or 0)."""
    return TrainingConfig(message.optimizer, message.learning_rate, message.l2, message.batch_size, message.seed)


def training_message(config: TrainingConfig) -> common_pb2.TrainingConfig:
    return common_pb2.TrainingConfig(
        optimizer=config.optimizer,
        learning_rate=config.learning_rate,
        l2=config.l2,
        batch_size=config.batch_size,
        seed=config.seed,
    )


def training_settings(training: common_pb2.TrainingConfig) -> dict[str, object]:
    """A TrainingConfig's model settings as plain values (unset: empty or 0); the family fills in its defaults."""
    return training_config(training).optimizer_values()


def steps_message(steps: Iterable[StepDescription]) -> list[common_pb2.ReleaseStep]:
    """Release steps (name, public parameters) as their messages."""
    return [common_pb2.ReleaseStep(name=name, params=params) for name, params in steps]


def steps_of(messages: Iterable[common_pb2.ReleaseStep]) -> list[StepDescription]:
    return [(m.name, dict(m.params)) for m in messages]


def released_model_message(released: ReleasedParams) -> coordinator_pb2.ReleasedModel:
    """The release point's model as ReleaseModel sends it (and ModelReply.released forwards it)."""
    blocks = [
        coordinator_pb2.PassiveBlock(party_id=party, withheld=True)
        if w is None
        else coordinator_pb2.PassiveBlock(party_id=party, weights=to_tensor(w))
        for party, w in released.passive.items()
    ]
    return coordinator_pb2.ReleasedModel(
        passive=blocks,
        chain=steps_message(released.chain),
        bias_offset=None if released.bias_offset is None else to_tensor(released.bias_offset),
        tensors={name: to_tensor(value) for name, value in released.tensors.items()},
    )


def released_model_of(message: coordinator_pb2.ReleasedModel) -> ReleasedParams:
    """The inverse of :func:`released_model_message`, every tensor validated (each block a matrix, the offset a
    vector)."""
    return ReleasedParams(
        passive={
            b.party_id: None if b.withheld else from_tensor(b.weights, f"weights of {b.party_id}", ndim=2).copy()
            for b in message.passive
        },
        bias_offset=(
            from_tensor(message.bias_offset, "bias offset", ndim=1).copy() if message.HasField("bias_offset") else None
        ),
        tensors={name: from_tensor(t, f"released {name}").copy() for name, t in message.tensors.items()},
        chain=steps_of(message.chain),
    )


def model_settings(model: common_pb2.ModelChoice, training: common_pb2.TrainingConfig) -> tuple[str, dict[str, Any]]:
    """The session's model family and its settings as plain values; an unset choice is LR (vflsec.v1 clients)."""
    family = model.WhichOneof("family") or "lr"
    if family in TREE_FAMILIES:
        return family, tree_settings(getattr(model, family), training)
    if family != "splitnn":
        return family, training_settings(training)
    m = model.splitnn
    _check_splitnn_fields(m, training)
    optimizer: dict[str, Any] = {
        "name": training.optimizer or "adam",
        "weight_decay": training.l2,
        "schedule": m.schedule or "constant",
    }
    for key, value in (
        ("learning_rate", training.learning_rate),
        ("momentum", m.momentum),
        ("step_epochs", m.step_epochs),
        ("gamma", m.gamma),
        ("epochs", m.schedule_epochs),
    ):
        if value:  # unset (0): the optimiser's default
            optimizer[key] = value
    values: dict[str, Any] = {
        "topology": m.topology or "coordinator-top",
        "bottom_hidden": list(m.bottom_hidden),
        "activation": m.activation or "relu",
        "dropout": m.dropout,
        "optimizer": optimizer,
        "seed": training.seed,
        "party": m.party,
    }
    if m.embedding:
        values["embedding"] = m.embedding
    if m.passive_width:
        values["passive_width"] = m.passive_width
    if m.gradient_defense:
        values["gradient_defense"] = list(m.gradient_defense)
    if m.top_hidden:
        values["top_hidden"] = list(m.top_hidden)
    for flag in ("bottom_bias", "top_bias"):
        if m.HasField(flag):
            values[flag] = getattr(m, flag)
    return family, values


def _check_splitnn_fields(m: common_pb2.SplitNnModel, training: common_pb2.TrainingConfig) -> None:
    """Refuse a SplitNnModel field set where the session would not use it (rather than drop it silently)."""
    schedule, optimizer = m.schedule or "constant", training.optimizer or "adam"
    topology = m.topology or "coordinator-top"
    misplaced = [  # (field, set where it is not used, where it applies, what the session has)
        ("momentum", m.momentum and optimizer != "sgd", "the sgd optimizer", optimizer),
        ("step_epochs", m.step_epochs and schedule != "step", "the step schedule", schedule),
        ("gamma", m.gamma and schedule != "step", "the step schedule", schedule),
        ("schedule_epochs", m.schedule_epochs and schedule != "cosine", "the cosine schedule", schedule),
        ("passive_width", m.passive_width and topology != "active-top", "the active-top topology", topology),
    ]
    for name, failed, applies, has in misplaced:
        if failed:
            raise InvalidArgument(f"SplitNnModel.{name} applies to {applies} only; this session has {has}")


TREE_FAMILIES = ("tree", "forest")
_TREE_FIELDS = ("max_depth", "min_samples_leaf", "n_bins", "n_trees", "feature_fraction", "party")
# What model_choice carries for split-NN: the model's keys and, under "optimizer", the schedule's. The optimiser's
# name, rate and L2 and the seed travel in the TrainingConfig (an operator gives them to create_session).
_SPLITNN_KEYS = (
    "topology", "embedding", "bottom_hidden", "top_hidden", "activation", "dropout", "bottom_bias", "top_bias",
    "passive_width", "optimizer", "party", "seed", "gradient_defense",
)  # fmt: skip
_SPLITNN_OPTIMIZER_KEYS = (
    "momentum", "schedule", "step_epochs", "gamma", "epochs", "name", "learning_rate", "weight_decay",
)  # fmt: skip


def check_keys(what: str, values: Mapping[str, Any], accepted: Iterable[str], hint: str = "") -> None:
    """INVALID_ARGUMENT naming every key of ``values`` outside ``accepted``, and the accepted ones."""
    unknown = sorted(set(values) - set(accepted))
    if unknown:
        raise InvalidArgument(
            f"{what}: unknown or misplaced key(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}{hint}"
        )


def check_settings(family: str, values: Mapping[str, Any]) -> None:
    """A family's settings as :func:`model_choice` takes them: every key must be one it carries."""
    if family in TREE_FAMILIES:
        check_keys(f"{family} settings", values, (*_TREE_FIELDS, "bootstrap", "seed", "partition_defense"))
    elif family == "splitnn":
        hint = f" (the optimiser's {', '.join(_SPLITNN_OPTIMIZER_KEYS[:5])} go under 'optimizer')"
        check_keys("split-NN settings", values, _SPLITNN_KEYS, hint)
        optimizer = values.get("optimizer") or {}
        if not isinstance(optimizer, Mapping):
            raise InvalidArgument(f"split-NN settings: 'optimizer' must be a mapping, got {optimizer!r}")
        check_keys("split-NN settings['optimizer']", optimizer, _SPLITNN_OPTIMIZER_KEYS)
        if "top_hidden" in values and not list(values["top_hidden"] or ()):
            # The wire reads an empty top_hidden as its default (32,): refused here rather than built silently.
            raise InvalidArgument("split-NN settings: top_hidden must name at least one hidden width (a linear top is "
                                  "not offered)")


def tree_settings(m: common_pb2.TreeModel, training: common_pb2.TrainingConfig) -> dict[str, Any]:
    """A TreeModel's settings as plain values: unset (0) fields are left to the family's defaults."""
    values: dict[str, Any] = {name: getattr(m, name) for name in _TREE_FIELDS if getattr(m, name)}
    if m.HasField("bootstrap"):
        values["bootstrap"] = m.bootstrap
    if m.partition_defense:
        values["partition_defense"] = list(m.partition_defense)
    return {**values, "seed": training.seed}


def model_choice(family: str, values: Mapping[str, Any]) -> common_pb2.ModelChoice:
    """The inverse of :func:`model_settings` for the model part (the optimiser's name, rate, L2 and the seed travel
    in the TrainingConfig). A key it does not carry is INVALID_ARGUMENT (:func:`check_settings`)."""
    check_settings(family, values)
    if family in TREE_FAMILIES:
        fields = {name: values[name] for name in (*_TREE_FIELDS, "bootstrap") if values.get(name) is not None}
        fields["partition_defense"] = list(values.get("partition_defense") or ())
        return common_pb2.ModelChoice(**{family: common_pb2.TreeModel(**fields)})
    if family != "splitnn":
        return common_pb2.ModelChoice(lr=common_pb2.LrModel())
    optimizer = values.get("optimizer", {})
    return common_pb2.ModelChoice(
        splitnn=common_pb2.SplitNnModel(
            topology=values.get("topology", ""),
            embedding=values.get("embedding", 0),
            bottom_hidden=list(values.get("bottom_hidden", ())),
            top_hidden=list(values.get("top_hidden", ())),
            activation=values.get("activation", ""),
            dropout=values.get("dropout", 0.0),
            bottom_bias=values.get("bottom_bias"),
            top_bias=values.get("top_bias"),
            momentum=optimizer.get("momentum", 0.0),
            schedule=optimizer.get("schedule", ""),
            step_epochs=optimizer.get("step_epochs", 0),
            gamma=optimizer.get("gamma", 0.0),
            schedule_epochs=optimizer.get("epochs") or 0,
            party=values.get("party", 0),
            passive_width=values.get("passive_width") or 0,
            gradient_defense=list(values.get("gradient_defense") or ()),
        )
    )



def entry_status(error: ServiceError | None) -> common_pb2.EntryStatus:
    """One entry's outcome in a batched reply: OK, or its refusal's status and message."""
    if error is None:
        return common_pb2.EntryStatus()
    return common_pb2.EntryStatus(code=STATUS_CODES.get(error.code, STATUS_CODES["INTERNAL"]), message=str(error))


def entry_error(peer: str, status: common_pb2.EntryStatus) -> PeerFailed | None:
    """A batched reply's entry: None when OK, else the peer's refusal of it (passed on as a failed call's status)."""
    if status.code == 0:
        return None
    code = STATUS_NAMES[status.code] if 0 < status.code < len(STATUS_NAMES) else "UNKNOWN"
    return PeerFailed(peer, code, status.message)
