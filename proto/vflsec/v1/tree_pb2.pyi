from vflsec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TreeBegin(_message.Message):
    __slots__ = ("session_id", "sample_index", "bins")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    BINS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    bins: _containers.RepeatedCompositeFieldContainer[BinSizes]
    def __init__(self, session_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ..., bins: _Optional[_Iterable[_Union[BinSizes, _Mapping]]] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("bins", "aligned_rows", "training_rows")
    BINS_FIELD_NUMBER: _ClassVar[int]
    ALIGNED_ROWS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_ROWS_FIELD_NUMBER: _ClassVar[int]
    bins: BinSizes
    aligned_rows: int
    training_rows: int
    def __init__(self, bins: _Optional[_Union[BinSizes, _Mapping]] = ..., aligned_rows: _Optional[int] = ..., training_rows: _Optional[int] = ...) -> None: ...

class TreeRows(_message.Message):
    __slots__ = ("session_id", "sample_index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ...) -> None: ...

class BinSizes(_message.Message):
    __slots__ = ("sizes",)
    SIZES_FIELD_NUMBER: _ClassVar[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class PartyFeatures(_message.Message):
    __slots__ = ("party", "features")
    PARTY_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    party: int
    features: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, party: _Optional[int] = ..., features: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeTask(_message.Message):
    __slots__ = ("done", "tree", "node_id", "depth", "rows", "weights", "features")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    done: bool
    tree: int
    node_id: int
    depth: int
    rows: _containers.RepeatedScalarFieldContainer[int]
    weights: _containers.RepeatedScalarFieldContainer[float]
    features: _containers.RepeatedCompositeFieldContainer[PartyFeatures]
    def __init__(self, done: _Optional[bool] = ..., tree: _Optional[int] = ..., node_id: _Optional[int] = ..., depth: _Optional[int] = ..., rows: _Optional[_Iterable[int]] = ..., weights: _Optional[_Iterable[float]] = ..., features: _Optional[_Iterable[_Union[PartyFeatures, _Mapping]]] = ...) -> None: ...

class NodeKey(_message.Message):
    __slots__ = ("tree", "node_id")
    TREE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    tree: int
    node_id: int
    def __init__(self, tree: _Optional[int] = ..., node_id: _Optional[int] = ...) -> None: ...

class NodeTotals(_message.Message):
    __slots__ = ("session_id", "node", "totals")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node: NodeKey
    totals: _common_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., node: _Optional[_Union[NodeKey, _Mapping]] = ..., totals: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class NodeOpened(_message.Message):
    __slots__ = ("search", "key_epoch", "derived")
    SEARCH_FIELD_NUMBER: _ClassVar[int]
    KEY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FIELD_NUMBER: _ClassVar[int]
    search: bool
    key_epoch: int
    derived: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, search: _Optional[bool] = ..., key_epoch: _Optional[int] = ..., derived: _Optional[_Iterable[int]] = ...) -> None: ...

class NodeKeysRequest(_message.Message):
    __slots__ = ("session_id", "key_epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    key_epoch: int
    def __init__(self, session_id: _Optional[str] = ..., key_epoch: _Optional[int] = ...) -> None: ...

class NodeKeysReply(_message.Message):
    __slots__ = ("public_context",)
    PUBLIC_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    public_context: bytes
    def __init__(self, public_context: _Optional[bytes] = ...) -> None: ...

class NodeIndicators(_message.Message):
    __slots__ = ("session_id", "task", "indicators", "key_epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    INDICATORS_FIELD_NUMBER: _ClassVar[int]
    KEY_EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task: NodeTask
    indicators: _common_pb2.EncryptedMatrix
    key_epoch: int
    def __init__(self, session_id: _Optional[str] = ..., task: _Optional[_Union[NodeTask, _Mapping]] = ..., indicators: _Optional[_Union[_common_pb2.EncryptedMatrix, _Mapping]] = ..., key_epoch: _Optional[int] = ...) -> None: ...

class NodeCounts(_message.Message):
    __slots__ = ("session_id", "node", "products", "mask_sums", "part", "parts", "bin_weights", "task_digest")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PRODUCTS_FIELD_NUMBER: _ClassVar[int]
    MASK_SUMS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    BIN_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TASK_DIGEST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node: NodeKey
    products: _containers.RepeatedScalarFieldContainer[bytes]
    mask_sums: _common_pb2.Tensor
    part: int
    parts: int
    bin_weights: _common_pb2.Tensor
    task_digest: bytes
    def __init__(self, session_id: _Optional[str] = ..., node: _Optional[_Union[NodeKey, _Mapping]] = ..., products: _Optional[_Iterable[bytes]] = ..., mask_sums: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., part: _Optional[int] = ..., parts: _Optional[int] = ..., bin_weights: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., task_digest: _Optional[bytes] = ...) -> None: ...

class NodeDecide(_message.Message):
    __slots__ = ("session_id", "node", "counts")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node: NodeKey
    counts: _common_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., node: _Optional[_Union[NodeKey, _Mapping]] = ..., counts: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("split", "own", "feature", "bin")
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    OWN_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    BIN_FIELD_NUMBER: _ClassVar[int]
    split: bool
    own: bool
    feature: int
    bin: int
    def __init__(self, split: _Optional[bool] = ..., own: _Optional[bool] = ..., feature: _Optional[int] = ..., bin: _Optional[int] = ...) -> None: ...

class NodePartition(_message.Message):
    __slots__ = ("session_id", "node", "goes_left")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GOES_LEFT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node: NodeKey
    goes_left: _common_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., node: _Optional[_Union[NodeKey, _Mapping]] = ..., goes_left: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class SplitChoice(_message.Message):
    __slots__ = ("session_id", "task", "feature", "bin")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    BIN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task: NodeTask
    feature: int
    bin: int
    def __init__(self, session_id: _Optional[str] = ..., task: _Optional[_Union[NodeTask, _Mapping]] = ..., feature: _Optional[int] = ..., bin: _Optional[int] = ...) -> None: ...

class ThresholdRequest(_message.Message):
    __slots__ = ("session_id", "steps")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    steps: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., steps: _Optional[_Iterable[str]] = ...) -> None: ...

class Thresholds(_message.Message):
    __slots__ = ("withheld", "nodes", "thresholds")
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLDS_FIELD_NUMBER: _ClassVar[int]
    withheld: bool
    nodes: _containers.RepeatedCompositeFieldContainer[NodeKey]
    thresholds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, withheld: _Optional[bool] = ..., nodes: _Optional[_Iterable[_Union[NodeKey, _Mapping]]] = ..., thresholds: _Optional[_Iterable[float]] = ...) -> None: ...
