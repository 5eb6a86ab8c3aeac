from vflsec.v1 import common_pb2 as _common_pb2
from vflsec.v1 import coordinator_pb2 as _coordinator_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("session_id", "backend", "training", "model")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    backend: _common_pb2.Backend
    training: _common_pb2.TrainingConfig
    model: _common_pb2.ModelChoice
    def __init__(self, session_id: _Optional[str] = ..., backend: _Optional[_Union[_common_pb2.Backend, str]] = ..., training: _Optional[_Union[_common_pb2.TrainingConfig, _Mapping]] = ..., model: _Optional[_Union[_common_pb2.ModelChoice, _Mapping]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "n_classes", "class_names", "n_active_features", "passive_features", "score_release", "param_release")
    class PassiveFeaturesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    N_CLASSES_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    N_ACTIVE_FEATURES_FIELD_NUMBER: _ClassVar[int]
    PASSIVE_FEATURES_FIELD_NUMBER: _ClassVar[int]
    SCORE_RELEASE_FIELD_NUMBER: _ClassVar[int]
    PARAM_RELEASE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    n_classes: int
    class_names: _containers.RepeatedScalarFieldContainer[str]
    n_active_features: int
    passive_features: _containers.ScalarMap[str, int]
    score_release: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    param_release: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    def __init__(self, session_id: _Optional[str] = ..., n_classes: _Optional[int] = ..., class_names: _Optional[_Iterable[str]] = ..., n_active_features: _Optional[int] = ..., passive_features: _Optional[_Mapping[str, int]] = ..., score_release: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., param_release: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ...) -> None: ...

class AlignReply(_message.Message):
    __slots__ = ("common_ids", "n_active", "n_common")
    COMMON_IDS_FIELD_NUMBER: _ClassVar[int]
    N_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    N_COMMON_FIELD_NUMBER: _ClassVar[int]
    common_ids: _containers.RepeatedScalarFieldContainer[str]
    n_active: int
    n_common: int
    def __init__(self, common_ids: _Optional[_Iterable[str]] = ..., n_active: _Optional[int] = ..., n_common: _Optional[int] = ...) -> None: ...

class AlignProgress(_message.Message):
    __slots__ = ("done", "total", "stage")
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    done: int
    total: int
    stage: str
    def __init__(self, done: _Optional[int] = ..., total: _Optional[int] = ..., stage: _Optional[str] = ...) -> None: ...

class AlignUpdate(_message.Message):
    __slots__ = ("progress", "common")
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    COMMON_FIELD_NUMBER: _ClassVar[int]
    progress: AlignProgress
    common: AlignReply
    def __init__(self, progress: _Optional[_Union[AlignProgress, _Mapping]] = ..., common: _Optional[_Union[AlignReply, _Mapping]] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("session_id", "sample_ids", "epochs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    epochs: int
    def __init__(self, session_id: _Optional[str] = ..., sample_ids: _Optional[_Iterable[str]] = ..., epochs: _Optional[int] = ...) -> None: ...

class TrainProgress(_message.Message):
    __slots__ = ("epoch", "batch", "n_batches", "step", "seconds", "done")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    N_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    batch: int
    n_batches: int
    step: int
    seconds: float
    done: bool
    def __init__(self, epoch: _Optional[int] = ..., batch: _Optional[int] = ..., n_batches: _Optional[int] = ..., step: _Optional[int] = ..., seconds: _Optional[float] = ..., done: _Optional[bool] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("session_id", "sample_ids")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., sample_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PredictReply(_message.Message):
    __slots__ = ("sample_ids", "scores", "chain", "argmax_changed")
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    CHAIN_FIELD_NUMBER: _ClassVar[int]
    ARGMAX_CHANGED_FIELD_NUMBER: _ClassVar[int]
    sample_ids: _containers.RepeatedScalarFieldContainer[str]
    scores: _common_pb2.Tensor
    chain: _containers.RepeatedCompositeFieldContainer[_common_pb2.ReleaseStep]
    argmax_changed: int
    def __init__(self, sample_ids: _Optional[_Iterable[str]] = ..., scores: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., chain: _Optional[_Iterable[_Union[_common_pb2.ReleaseStep, _Mapping]]] = ..., argmax_changed: _Optional[int] = ...) -> None: ...

class ModelReply(_message.Message):
    __slots__ = ("active_weights", "bias", "released", "family", "tensors")
    class TensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
    ACTIVE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    active_weights: _common_pb2.Tensor
    bias: _common_pb2.Tensor
    released: _coordinator_pb2.ReleasedModel
    family: str
    tensors: _containers.MessageMap[str, _common_pb2.Tensor]
    def __init__(self, active_weights: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., bias: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., released: _Optional[_Union[_coordinator_pb2.ReleasedModel, _Mapping]] = ..., family: _Optional[str] = ..., tensors: _Optional[_Mapping[str, _common_pb2.Tensor]] = ...) -> None: ...
