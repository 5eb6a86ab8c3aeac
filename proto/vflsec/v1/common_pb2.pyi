from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]

class Backend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKEND_UNSPECIFIED: _ClassVar[Backend]
    BACKEND_CKKS: _ClassVar[Backend]
    BACKEND_PLAIN: _ClassVar[Backend]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT32: DType
DTYPE_INT64: DType
BACKEND_UNSPECIFIED: Backend
BACKEND_CKKS: Backend
BACKEND_PLAIN: Backend

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class EncryptedMatrix(_message.Message):
    __slots__ = ("rows", "cols", "replicas", "rows_per_ciphertext", "ciphertexts")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    cols: int
    replicas: int
    rows_per_ciphertext: int
    ciphertexts: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, rows: _Optional[int] = ..., cols: _Optional[int] = ..., replicas: _Optional[int] = ..., rows_per_ciphertext: _Optional[int] = ..., ciphertexts: _Optional[_Iterable[bytes]] = ...) -> None: ...

class SessionRef(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EntryStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class EntryStatuses(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: _containers.RepeatedCompositeFieldContainer[EntryStatus]
    def __init__(self, status: _Optional[_Iterable[_Union[EntryStatus, _Mapping]]] = ...) -> None: ...

class QueryRows(_message.Message):
    __slots__ = ("query_id", "sample_index")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, query_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ...) -> None: ...

class QueryShare(_message.Message):
    __slots__ = ("query_id", "sample_index", "share")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    share: bytes
    def __init__(self, query_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ..., share: _Optional[bytes] = ...) -> None: ...

class TrainingConfig(_message.Message):
    __slots__ = ("optimizer", "learning_rate", "l2", "batch_size", "seed")
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    optimizer: str
    learning_rate: float
    l2: float
    batch_size: int
    seed: int
    def __init__(self, optimizer: _Optional[str] = ..., learning_rate: _Optional[float] = ..., l2: _Optional[float] = ..., batch_size: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class ReleaseStep(_message.Message):
    __slots__ = ("name", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelChoice(_message.Message):
    __slots__ = ("lr", "splitnn", "tree", "forest")
    LR_FIELD_NUMBER: _ClassVar[int]
    SPLITNN_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    FOREST_FIELD_NUMBER: _ClassVar[int]
    lr: LrModel
    splitnn: SplitNnModel
    tree: TreeModel
    forest: TreeModel
    def __init__(self, lr: _Optional[_Union[LrModel, _Mapping]] = ..., splitnn: _Optional[_Union[SplitNnModel, _Mapping]] = ..., tree: _Optional[_Union[TreeModel, _Mapping]] = ..., forest: _Optional[_Union[TreeModel, _Mapping]] = ...) -> None: ...

class LrModel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SplitNnModel(_message.Message):
    __slots__ = ("topology", "embedding", "bottom_hidden", "top_hidden", "activation", "dropout", "bottom_bias", "top_bias", "momentum", "schedule", "step_epochs", "gamma", "schedule_epochs", "party", "passive_width", "gradient_defense")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    BOTTOM_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    TOP_HIDDEN_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    BOTTOM_BIAS_FIELD_NUMBER: _ClassVar[int]
    TOP_BIAS_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    STEP_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_DEFENSE_FIELD_NUMBER: _ClassVar[int]
    topology: str
    embedding: int
    bottom_hidden: _containers.RepeatedScalarFieldContainer[int]
    top_hidden: _containers.RepeatedScalarFieldContainer[int]
    activation: str
    dropout: float
    bottom_bias: bool
    top_bias: bool
    momentum: float
    schedule: str
    step_epochs: int
    gamma: float
    schedule_epochs: int
    party: int
    passive_width: int
    gradient_defense: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topology: _Optional[str] = ..., embedding: _Optional[int] = ..., bottom_hidden: _Optional[_Iterable[int]] = ..., top_hidden: _Optional[_Iterable[int]] = ..., activation: _Optional[str] = ..., dropout: _Optional[float] = ..., bottom_bias: _Optional[bool] = ..., top_bias: _Optional[bool] = ..., momentum: _Optional[float] = ..., schedule: _Optional[str] = ..., step_epochs: _Optional[int] = ..., gamma: _Optional[float] = ..., schedule_epochs: _Optional[int] = ..., party: _Optional[int] = ..., passive_width: _Optional[int] = ..., gradient_defense: _Optional[_Iterable[str]] = ...) -> None: ...

class TreeModel(_message.Message):
    __slots__ = ("max_depth", "min_samples_leaf", "n_bins", "n_trees", "bootstrap", "feature_fraction", "party", "partition_defense")
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLES_LEAF_FIELD_NUMBER: _ClassVar[int]
    N_BINS_FIELD_NUMBER: _ClassVar[int]
    N_TREES_FIELD_NUMBER: _ClassVar[int]
    BOOTSTRAP_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_DEFENSE_FIELD_NUMBER: _ClassVar[int]
    max_depth: int
    min_samples_leaf: int
    n_bins: int
    n_trees: int
    bootstrap: bool
    feature_fraction: float
    party: int
    partition_defense: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_depth: _Optional[int] = ..., min_samples_leaf: _Optional[int] = ..., n_bins: _Optional[int] = ..., n_trees: _Optional[int] = ..., bootstrap: _Optional[bool] = ..., feature_fraction: _Optional[float] = ..., party: _Optional[int] = ..., partition_defense: _Optional[_Iterable[str]] = ...) -> None: ...
