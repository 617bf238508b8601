"""The service's protobuf messages, built at import from the schema compiled into the native
extension (``proto/strata/serve/v1/serve.proto``): no generated files to keep in step."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .. import _native

PACKAGE = "strata.serve.v1"
SERVICE = f"{PACKAGE}.GraphLearning"

_files = descriptor_pb2.FileDescriptorSet.FromString(_native.serve_descriptor())
# A pool of our own, so the schema never clashes with anything else the process loaded.
_pool = descriptor_pool.DescriptorPool()
_classes = message_factory.GetMessages(list(_files.file), pool=_pool)


def message(name: str):
    """The message class ``strata.serve.v1.NAME``."""
    return _classes[f"{PACKAGE}.{name}"]


def enum_value(enum: str, name: str) -> int:
    """The number of value ``name`` of enum ``strata.serve.v1.ENUM``."""
    return _pool.FindEnumTypeByName(f"{PACKAGE}.{enum}").values_by_name[name].number


def enum_name(enum: str, number: int) -> str:
    """The name of value ``number`` of enum ``strata.serve.v1.ENUM``."""
    values = _pool.FindEnumTypeByName(f"{PACKAGE}.{enum}").values_by_number
    return values[number].name if number in values else str(number)


#: (request, response, server-streaming) message names of every RPC, from the schema.
METHODS = {
    m.name: (m.input_type.rsplit(".", 1)[-1], m.output_type.rsplit(".", 1)[-1], m.server_streaming)
    for f in _files.file
    for s in f.service
    for m in s.method
}
