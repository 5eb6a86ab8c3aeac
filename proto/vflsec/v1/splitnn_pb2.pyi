from vflsec.v1 import common_pb2 as _common_pb2
from vflsec.v1 import passive_pb2 as _passive_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TopStepRequest(_message.Message):
    __slots__ = ("session_id", "step", "sample_index", "share", "labels", "widths", "epoch")
    class WidthsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    WIDTHS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    sample_index: _containers.RepeatedScalarFieldContainer[int]
    share: bytes
    labels: _common_pb2.Tensor
    widths: _containers.ScalarMap[str, int]
    epoch: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., sample_index: _Optional[_Iterable[int]] = ..., share: _Optional[bytes] = ..., labels: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., widths: _Optional[_Mapping[str, int]] = ..., epoch: _Optional[int] = ...) -> None: ...

class EmbeddingShare(_message.Message):
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

class EmbeddingSent(_message.Message):
    __slots__ = ("nonce",)
    NONCE_FIELD_NUMBER: _ClassVar[int]
    nonce: bytes
    def __init__(self, nonce: _Optional[bytes] = ...) -> None: ...

class TopStepReply(_message.Message):
    __slots__ = ("gradient", "loss")
    GRADIENT_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    gradient: _common_pb2.Tensor
    loss: float
    def __init__(self, gradient: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., loss: _Optional[float] = ...) -> None: ...

class NamedTensors(_message.Message):
    __slots__ = ("tensors",)
    class TensorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ...) -> None: ...
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.MessageMap[str, _common_pb2.Tensor]
    def __init__(self, tensors: _Optional[_Mapping[str, _common_pb2.Tensor]] = ...) -> None: ...
