"""Server reflection, v1alpha and v1, so grpcurl, grpcui and Postman can list and call the API.

grpcio-reflection only ships v1alpha (grpc/grpc#38576); grpcurl 1.8.6 speaks v1alpha, newer tools
try v1 first. v1 is the same protocol under another package name: the messages are field for
field the same, so the library's servicer serves both, and the v1 file descriptor is derived from
the v1alpha one by renaming its package (added once to the default pool, so that clients can
also describe ``grpc.reflection.v1.ServerReflection``).

Reflection also describes ``google.rpc.ErrorInfo``, the detail every error carries (see
``status``), so grpcurl prints it decoded. The coordinator only has snapcoord's wire-compatible copy
(``snapcoord.v1.ErrorInfo``); the servicer answers from a pool of its own holding the served files
plus that copy renamed to ``google.rpc``. Keeping it out of the default pool means it can never
clash with googleapis-common-protos' real ``google/rpc/error_details.proto`` in the same process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

from snapcoord.v1 import error_details_pb2

V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
SERVICE_NAMES = (V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)

_V1ALPHA_PACKAGE = ".grpc.reflection.v1alpha."
_V1_PACKAGE = ".grpc.reflection.v1."
_pool_lock = threading.Lock()


def enable_reflection(server: grpc.Server, service_names: Iterable[str]) -> None:
    """Serve reflection v1alpha and v1 on ``server``, listing ``service_names`` (which should
    include ``SERVICE_NAMES``)."""
    names = tuple(service_names)
    _ensure_v1_descriptor(descriptor_pool.Default())
    pool = reflection_pool(names)
    reflection.enable_server_reflection(names, server, pool=pool)
    servicer = reflection.ReflectionServicer(names, pool=pool)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE_NAME,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


def _ensure_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    with _pool_lock:  # two servers built at once must not both add the file
        try:
            pool.FindServiceByName(V1_SERVICE_NAME)
            return
        except KeyError:
            pass
        proto = descriptor_pb2.FileDescriptorProto()
        reflection_pb2.DESCRIPTOR.CopyToProto(proto)
        proto.name = "grpc/reflection/v1/reflection.proto"
        proto.package = "grpc.reflection.v1"
        proto.ClearField("options")  # language package options name the v1alpha packages
        for message in proto.message_type:
            _rename_types(message)
        for service in proto.service:
            for method in service.method:
                method.input_type = method.input_type.replace(_V1ALPHA_PACKAGE, _V1_PACKAGE)
                method.output_type = method.output_type.replace(_V1ALPHA_PACKAGE, _V1_PACKAGE)
        pool.Add(proto)


def _rename_types(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type_name:
            field.type_name = field.type_name.replace(_V1ALPHA_PACKAGE, _V1_PACKAGE)
    for nested in message.nested_type:
        _rename_types(nested)


#: The file and package reflection serves ErrorInfo under: the names googleapis gives it.
ERROR_DETAILS_FILE = "google/rpc/error_details.proto"
_OUR_ERROR_INFO = ".snapcoord.v1.ErrorInfo"
_GOOGLE_ERROR_INFO = ".google.rpc.ErrorInfo"


def reflection_pool(service_names: Iterable[str]) -> descriptor_pool.DescriptorPool:
    """A pool with the files of ``service_names`` (from the default pool, with their imports) and
    ``google.rpc.ErrorInfo``. Names the default pool does not know (generic handlers without a
    descriptor) are left out, as the library's servicer would not find them either."""
    default = descriptor_pool.Default()
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor.FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:  # a pool takes a file only after its imports
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
        added.add(file.name)

    for name in service_names:
        try:
            add(default.FindFileContainingSymbol(name))
        except KeyError:
            continue
    if ERROR_DETAILS_FILE not in added:
        pool.Add(google_error_details_file())
    return pool


def google_error_details_file() -> descriptor_pb2.FileDescriptorProto:
    """``google/rpc/error_details.proto`` reduced to ErrorInfo, derived from snapcoord's copy."""
    ours = descriptor_pb2.FileDescriptorProto()
    error_details_pb2.DESCRIPTOR.CopyToProto(ours)
    (info,) = (m for m in ours.message_type if m.name == "ErrorInfo")
    proto = descriptor_pb2.FileDescriptorProto(
        name=ERROR_DETAILS_FILE, package="google.rpc", syntax=ours.syntax, message_type=[info]
    )
    message = proto.message_type[0]
    for field in [*message.field, *(f for entry in message.nested_type for f in entry.field)]:
        if field.type_name:  # the metadata map's entry type; assigning "" would mark it as set
            field.type_name = field.type_name.replace(_OUR_ERROR_INFO, _GOOGLE_ERROR_INFO)
    return proto
