"""Server reflection, v1alpha and v1, so grpcurl, grpcui and Postman can list and call the API.

grpcio-reflection only ships v1alpha (grpc/grpc#38576); grpcurl 1.8.6 speaks v1alpha, newer tools
try v1 first. v1 is the same protocol under another package name: the messages are field for
field the same, so the library's servicer serves both, and the v1 file descriptor is derived from
the v1alpha one by renaming its package (added once to the default pool, so that clients can
also describe ``grpc.reflection.v1.ServerReflection``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

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
    reflection.enable_server_reflection(names, server)
    servicer = reflection.ReflectionServicer(names)
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
