"""Message classes of a kubelet API, built from its committed descriptor in a private descriptor pool.

A private pool per API means the classes clash with no other copy of the same package (`v1`, `v1beta1`)
that a process may load, such as the kubernetes client's or a test tool's.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def message_classes(file_descriptor: bytes, package: str) -> Callable[[str], type]:
    """A function from a message name to its class, for the API in `file_descriptor`."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(file_descriptor))

    def message(name: str) -> type:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
    return message
