"""librdkafka's mock cluster driven through ctypes (confluent-kafka does not expose its API):
a standalone cluster with error injection, leader moves and RTT. Not a stable ABI: only tests."""
from __future__ import annotations

import ctypes
import glob
import os

import confluent_kafka

_LIB = None


def _lib():
    global _LIB
    if _LIB is None:
        base = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
        path = glob.glob(os.path.join(base, "confluent_kafka.libs", "librdkafka*.so*"))[0]
        lib = ctypes.CDLL(path)
        lib.rd_kafka_conf_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
        lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        lib.rd_kafka_mock_push_request_errors_array.argtypes = [
            ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
        lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                                           ctypes.c_int32, ctypes.c_int32]
        lib.rd_kafka_mock_broker_set_rtt.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int]
        lib.rd_kafka_mock_set_apiversion.argtypes = [ctypes.c_void_p, ctypes.c_int16, ctypes.c_int16,
                                                     ctypes.c_int16]
        lib.rd_kafka_mock_topic_set_error.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        lib.rd_kafka_mock_broker_set_down.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        lib.rd_kafka_mock_broker_set_up.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        _LIB = lib
    return _LIB


class MockCluster:
    def __init__(self, brokers: int = 1) -> None:
        lib = _lib()
        err = ctypes.create_string_buffer(512)
        self._rk = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), err, 512)
        if not self._rk:
            raise RuntimeError(err.value.decode())
        self._mc = lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()

    def create_topic(self, name: str, partitions: int = 1, replication: int = 1) -> None:
        rc = _lib().rd_kafka_mock_topic_create(self._mc, name.encode(), partitions, replication)
        if rc:
            raise RuntimeError(f"topic create failed: {rc}")

    def push_errors(self, api_key: int, *errors: int) -> None:
        arr = (ctypes.c_int * len(errors))(*errors)
        _lib().rd_kafka_mock_push_request_errors_array(self._mc, api_key, len(errors), arr)

    def set_topic_error(self, topic: str, error: int) -> None:
        """Metadata answers carry `error` for this topic (0 clears it)."""
        _lib().rd_kafka_mock_topic_set_error(self._mc, topic.encode(), error)

    def set_apiversion(self, api_key: int, min_version: int, max_version: int) -> None:
        """(-1, -1) removes the API from the mock's ApiVersions answer."""
        _lib().rd_kafka_mock_set_apiversion(self._mc, api_key, min_version, max_version)

    def set_leader(self, topic: str, partition: int, broker: int) -> None:
        _lib().rd_kafka_mock_partition_set_leader(self._mc, topic.encode(), partition, broker)

    def set_down(self, broker: int) -> None:
        _lib().rd_kafka_mock_broker_set_down(self._mc, broker)

    def set_up(self, broker: int) -> None:
        _lib().rd_kafka_mock_broker_set_up(self._mc, broker)

    def set_rtt(self, broker: int, rtt_ms: int) -> None:
        _lib().rd_kafka_mock_broker_set_rtt(self._mc, broker, rtt_ms)

    def close(self) -> None:
        if self._mc:
            _lib().rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if self._rk:
            _lib().rd_kafka_destroy(self._rk)
            self._rk = None
