from vflsec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinSessionRequest(_message.Message):
    __slots__ = ("session_id", "backend", "n_classes", "training", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    N_CLASSES_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    backend: _common_pb2.Backend
    n_classes: int
    training: _common_pb2.TrainingConfig
    model: _common_pb2.ModelChoice
    def __init__(self, session_id: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., n_classes: _Optional[int] = ..., training: _Optional[_Union[_common_pb2.TrainingConfig, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.ModelChoice, _Mapping]] = ...) -> None: ...

class JoinSessionReply(_message.Message):
    __slots__ = ("n_features", "n_rows", "embedding_release", "output_width", "share_mask_key")
    N_FEATURES_FIELD_NUMBER: _ClassVar[int]
    N_ROWS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_RELEASE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_WIDTH_FIELD_NUMBER: _ClassVar[int]
    SHARE_MASK_KEY_FIELD_NUMBER: _ClassVar[int]
    n_features: int
    n_rows: int
    embedding_release: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    output_width: int
    share_mask_key: bytes
    def __init__(self, n_features: _Optional[int] = ..., n_rows: _Optional[int] = ..., embedding_release: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., output_width: _Optional[int] = ..., share_mask_key: _Optional[bytes] = ...) -> None: ...

class PointChunk(_message.Message):
    __slots__ = ("index", "chunks", "points", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    chunks: int
    points: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., chunks: _Optional[int] = ..., points: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PsiExchangeRequest(_message.Message):
    __slots__ = ("session_id", "salt", "blinded")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    BLINDED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    salt: bytes
    blinded: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, session_id: _Optional[str] = ..., salt: _Optional[bytes] = ..., blinded: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PsiExchangeReply(_message.Message):
    __slots__ = ("double_blinded", "own_blinded")
    DOUBLE_BLINDED_FIELD_NUMBER: _ClassVar[int]
    OWN_BLINDED_FIELD_NUMBER: _ClassVar[int]
    double_blinded: _containers.RepeatedScalarFieldContainer[bytes]
    own_blinded: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, double_blinded: _Optional[_Iterable[bytes]] = ..., own_blinded: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PsiExchangeChunk(_message.Message):
    __slots__ = ("session_id", "salt", "blinded")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    BLINDED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    salt: bytes
    blinded: PointChunk
    def __init__(self, session_id: _Optional[str] = ..., salt: _Optional[bytes] = ..., blinded: _Optional[_Union[PointChunk, _Mapping]] = ...) -> None: ...

class PsiExchangeChunkReply(_message.Message):
    __slots__ = ("double_blinded", "own_blinded")
    DOUBLE_BLINDED_FIELD_NUMBER: _ClassVar[int]
    OWN_BLINDED_FIELD_NUMBER: _ClassVar[int]
    double_blinded: PointChunk
    own_blinded: PointChunk
    def __init__(self, double_blinded: _Optional[_Union[PointChunk, _Mapping]] = ..., own_blinded: _Optional[_Union[PointChunk, _Mapping]] = ...) -> None: ...

class PsiOprfHello(_message.Message):
    __slots__ = ("session_id", "salt", "hash_key", "bins", "base_point")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    HASH_KEY_FIELD_NUMBER: _ClassVar[int]
    BINS_FIELD_NUMBER: _ClassVar[int]
    BASE_POINT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    salt: bytes
    hash_key: bytes
    bins: int
    base_point: bytes
    def __init__(self, session_id: _Optional[str] = ..., salt: _Optional[bytes] = ..., hash_key: _Optional[bytes] = ..., bins: _Optional[int] = ..., base_point: _Optional[bytes] = ...) -> None: ...

class PsiOprfRequest(_message.Message):
    __slots__ = ("hello", "u_rows", "proof")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    U_ROWS_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    hello: PsiOprfHello
    u_rows: bytes
    proof: PsiOprfProof
    def __init__(self, hello: _Optional[_Union[PsiOprfHello, _Mapping]] = ..., u_rows: _Optional[bytes] = ..., proof: _Optional[_Union[PsiOprfProof, _Mapping]] = ...) -> None: ...

class PsiOprfProof(_message.Message):
    __slots__ = ("words", "rows")
    WORDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    words: bytes
    rows: bytes
    def __init__(self, words: _Optional[bytes] = ..., rows: _Optional[bytes] = ...) -> None: ...

class PsiOprfKeys(_message.Message):
    __slots__ = ("code_key", "base_answers")
    CODE_KEY_FIELD_NUMBER: _ClassVar[int]
    BASE_ANSWERS_FIELD_NUMBER: _ClassVar[int]
    code_key: bytes
    base_answers: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, code_key: _Optional[bytes] = ..., base_answers: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PsiOprfReply(_message.Message):
    __slots__ = ("keys", "values", "challenge")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    keys: PsiOprfKeys
    values: PointChunk
    challenge: bytes
    def __init__(self, keys: _Optional[_Union[PsiOprfKeys, _Mapping]] = ..., values: _Optional[_Union[PointChunk, _Mapping]] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class PsiFinishRequest(_message.Message):
    __slots__ = ("session_id", "positions")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    positions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., positions: _Optional[_Iterable[int]] = ...) -> None: ...

class PsiFinishReply(_message.Message):
    __slots__ = ("n_common",)
    N_COMMON_FIELD_NUMBER: _ClassVar[int]
    n_common: int
    def __init__(self, n_common: _Optional[int] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("session_id", "step", "sample_index", "epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., sample_index: _Optional[_Iterable[int]] = ..., epoch: _Optional[int] = ...) -> None: ...

class ShareLogitsRequest(_message.Message):
    __slots__ = ("session_id", "query_id", "sample_index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    query_id: str
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[str] = ..., query_id: _Optional[str] = ..., sample_index: _Optional[_Iterable[int]] = ...) -> None: ...

class ShareLogitsBatchRequest(_message.Message):
    __slots__ = ("session_id", "queries")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    queries: _containers.RepeatedCompositeFieldContainer[_common_pb2.QueryRows]
    def __init__(self, session_id: _Optional[str] = ..., queries: _Optional[_Iterable[_Union[_common_pb2.QueryRows, _Mapping]]] = ...) -> None: ...

class BackwardRequest(_message.Message):
    __slots__ = ("session_id", "step", "sample_index", "delta", "gradient")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    delta: _common_pb2.EncryptedMatrix
    gradient: _common_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., sample_index: _Optional[_Iterable[int]] = ..., delta: _Optional[_Union[_common_pb2.EncryptedMatrix, _Mapping]] = ..., gradient: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...

class DiscloseRequest(_message.Message):
    __slots__ = ("session_id", "steps", "warn_fraction")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    WARN_FRACTION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    steps: _containers.RepeatedScalarFieldContainer[str]
    warn_fraction: float
    def __init__(self, session_id: _Optional[str] = ..., steps: _Optional[_Iterable[str]] = ..., warn_fraction: _Optional[float] = ...) -> None: ...

class DisclosedStep(_message.Message):
    __slots__ = ("name", "withheld", "weights", "bias_offset", "public", "private")
    class PublicEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PrivateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    BIAS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    withheld: bool
    weights: _common_pb2.Tensor
    bias_offset: _common_pb2.Tensor
    public: _containers.ScalarMap[str, str]
    private: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., withheld: _Optional[bool] = ..., weights: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., bias_offset: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., public: _Optional[_Mapping[str, str]] = ..., private: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Disclosure(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[DisclosedStep]
    def __init__(self, steps: _Optional[_Iterable[_Union[DisclosedStep, _Mapping]]] = ...) -> None: ...

class RiskForecast(_message.Message):
    __slots__ = ("d", "n_classes", "rank", "half", "withheld", "ls", "half_star", "rank_condition", "zero_error", "warnings")
    D_FIELD_NUMBER: _ClassVar[int]
    N_CLASSES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HALF_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    LS_FIELD_NUMBER: _ClassVar[int]
    HALF_STAR_FIELD_NUMBER: _ClassVar[int]
    RANK_CONDITION_FIELD_NUMBER: _ClassVar[int]
    ZERO_ERROR_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    d: int
    n_classes: int
    rank: int
    half: float
    withheld: bool
    ls: float
    half_star: float
    rank_condition: bool
    zero_error: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, d: _Optional[int] = ..., n_classes: _Optional[int] = ..., rank: _Optional[int] = ..., half: _Optional[float] = ..., withheld: _Optional[bool] = ..., ls: _Optional[float] = ..., half_star: _Optional[float] = ..., rank_condition: _Optional[bool] = ..., zero_error: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class AlignedRowsReply(_message.Message):
    __slots__ = ("aligned_rows",)
    ALIGNED_ROWS_FIELD_NUMBER: _ClassVar[int]
    aligned_rows: int
    def __init__(self, aligned_rows: _Optional[int] = ...) -> None: ...
