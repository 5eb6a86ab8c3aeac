from vflsec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("session_id", "backend", "n_classes", "passive_parties", "model", "training")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    N_CLASSES_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_PARTIES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    backend: _common_pb2.Backend
    n_classes: int
    passive_parties: _containers.RepeatedScalarFieldContainer[str]
    model: _common_pb2.ModelChoice
    training: _common_pb2.TrainingConfig
    def __init__(self, session_id: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., n_classes: _Optional[int] = ..., passive_parties: _Optional[_Iterable[str]] = ..., model: _Optional[_Union[_common_pb2.ModelChoice, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.TrainingConfig, _Mapping]] = ...) -> None: ...

class OpenSessionReply(_message.Message):
    __slots__ = ("public_context", "score_release", "param_release")
    PUBLIC_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_RELEASE_FIELD_NUMBER: _ClassVar[int]
    PARAM_RELEASE_FIELD_NUMBER: _ClassVar[int]
    public_context: bytes
    score_release: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    param_release: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    def __init__(self, public_context: _Optional[bytes] = ..., score_release: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., param_release: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ...) -> None: ...

class PublicContext(_message.Message):
    __slots__ = ("backend", "data", "n_classes", "owner")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    N_CLASSES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    backend: _common_pb2.Backend
    data: bytes
    n_classes: int
    owner: str
    def __init__(self, backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., data: _Optional[bytes] = ..., n_classes: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class TrainingContextRequest(_message.Message):
    __slots__ = ("session_id", "step")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class TrainingContext(_message.Message):
    __slots__ = ("epoch", "rotation", "data")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROTATION_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    rotation: int
    data: bytes
    def __init__(self, epoch: _Optional[int] = ..., rotation: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TrainingScoresRequest(_message.Message):
    __slots__ = ("session_id", "step", "logits", "replicas", "sample_index", "widths", "share")
    class WidthsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LOGITS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIDTHS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    logits: _common_pb2.EncryptedMatrix
    replicas: int
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    widths: _containers.ScalarMap[str, int]
    share: bytes
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., logits: _Optional[_Union[_common_pb2.EncryptedMatrix, _Mapping]] = ..., replicas: _Optional[int] = ..., sample_index: _Optional[_Iterable[int]] = ..., widths: _Optional[_Mapping[str, int]] = ..., share: _Optional[bytes] = ...) -> None: ...

class TrainingShare(_message.Message):
    __slots__ = ("session_id", "step", "sample_index", "share")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    share: bytes
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., sample_index: _Optional[_Iterable[int]] = ..., share: _Optional[bytes] = ...) -> None: ...

class BlockSumsRequest(_message.Message):
    __slots__ = ("session_id", "step", "ciphertexts", "width", "mask_tag")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXTS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    MASK_TAG_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    ciphertexts: _containers.RepeatedScalarFieldContainer[bytes]
    width: int
    mask_tag: bytes
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., ciphertexts: _Optional[_Iterable[bytes]] = ..., width: _Optional[int] = ..., mask_tag: _Optional[bytes] = ...) -> None: ...

class ReleaseScoresRequest(_message.Message):
    __slots__ = ("session_id", "sample_index", "query_id", "share")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    query_id: str
    share: bytes
    def __init__(self, session_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ..., query_id: _Optional[str] = ..., share: _Optional[bytes] = ...) -> None: ...

class AdmitQueryRequest(_message.Message):
    __slots__ = ("session_id", "sample_index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ...) -> None: ...

class AdmitQueryReply(_message.Message):
    __slots__ = ("query_id", "scored", "budget")
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    query_id: str
    scored: int
    budget: int
    def __init__(self, query_id: _Optional[str] = ..., scored: _Optional[int] = ..., budget: _Optional[int] = ...) -> None: ...

class AdmitQueriesRequest(_message.Message):
    __slots__ = ("session_id", "queries")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    queries: _containers.RepeatedCompositeFieldContainer[_common_pb2.QueryRows]
    def __init__(self, session_id: _Optional[str] = ..., queries: _Optional[_Iterable[_Union[_common_pb2.QueryRows, _Mapping]]] = ...) -> None: ...

class AdmitQueriesReply(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[AdmittedQuery]
    def __init__(self, queries: _Optional[_Iterable[_Union[AdmittedQuery, _Mapping]]] = ...) -> None: ...

class AdmittedQuery(_message.Message):
    __slots__ = ("status", "admitted")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.EntryStatus
    admitted: AdmitQueryReply
    def __init__(self, status: _Optional[_Union[_common_pb2.EntryStatus, _Mapping]] = ..., admitted: _Optional[_Union[AdmitQueryReply, _Mapping]] = ...) -> None: ...

class SharesRequest(_message.Message):
    __slots__ = ("session_id", "shares")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    shares: _containers.RepeatedCompositeFieldContainer[_common_pb2.QueryShare]
    def __init__(self, session_id: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[_common_pb2.QueryShare, _Mapping]]] = ...) -> None: ...

class ReleaseBatchRequest(_message.Message):
    __slots__ = ("session_id", "queries")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    queries: _containers.RepeatedCompositeFieldContainer[_common_pb2.QueryShare]
    def __init__(self, session_id: _Optional[str] = ..., queries: _Optional[_Iterable[_Union[_common_pb2.QueryShare, _Mapping]]] = ...) -> None: ...

class ReleaseBatchReply(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: _containers.RepeatedCompositeFieldContainer[ReleasedEntry]
    def __init__(self, released: _Optional[_Iterable[_Union[ReleasedEntry, _Mapping]]] = ...) -> None: ...

class ReleasedEntry(_message.Message):
    __slots__ = ("status", "scores")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.EntryStatus
    scores: ReleasedScores
    def __init__(self, status: _Optional[_Union[_common_pb2.EntryStatus, _Mapping]] = ..., scores: _Optional[_Union[ReleasedScores, _Mapping]] = ...) -> None: ...

class ShareRequest(_message.Message):
    __slots__ = ("session_id", "query_id", "sample_index", "share")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    query_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    share: bytes
    def __init__(self, session_id: _Optional[str] = ..., query_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ..., share: _Optional[bytes] = ...) -> None: ...

class ReleasedScores(_message.Message):
    __slots__ = ("scores", "chain", "argmax_changed")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    ARGMAX_CHANGED_FIELD_NUMBER: _ClassVar[int]
    scores: _common_pb2.Tensor
    chain: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    argmax_changed: int
    def __init__(self, scores: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., chain: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., argmax_changed: _Optional[int] = ...) -> None: ...

class PassiveBlock(_message.Message):
    __slots__ = ("party_id", "withheld", "weights")
    PARTY_ID_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    party_id: str
    withheld: bool
    weights: _common_pb2.Tensor
    def __init__(self, party_id: _Optional[str] = ..., withheld: _Optional[bool] = ..., weights: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class ReleasedModel(_message.Message):
    __slots__ = ("passive", "chain", "bias_offset", "tensors")
    class TensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
    PASSIVE_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    BIAS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    passive: _containers.RepeatedCompositeFieldContainer[PassiveBlock]
    chain: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    bias_offset: _common_pb2.Tensor
    tensors: _containers.MessageMap[str, _common_pb2.Tensor]
    def __init__(self, passive: _Optional[_Iterable[_Union[PassiveBlock, _Mapping]]] = ..., chain: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., bias_offset: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., tensors: _Optional[_Mapping[str, _common_pb2.Tensor]] = ...) -> None: ...
