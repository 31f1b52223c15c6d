"""One partition as the broker sees it: validate a produced record set, append it, read it back.

This is the plain-append slice: records are validated (v2 batches by header and CRC-32C, v0/v1
message sets message by message) and appended. Producer-state deduplication is added inside
`append_from_client` as prepare -> append -> commit.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from oncelog.protocol.errors import ErrorCode, KafkaProtocolError
from oncelog.protocol import records as rec

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AppendResult:
    error_code: int = 0
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    error_message: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Partition:
    def __init__(self, topic: str, index: int, log, config=None, **_kwargs) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.config = config if config is not None else getattr(log, "config", None)
        self.producer_state = None

    # ------------------------------------------------------------------ reads
    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    def read(self, offset: int, max_bytes: int) -> bytes:
        return self.log.read(offset, max_bytes)

    def update_config(self, config) -> None:
        self.config = config
        self.log.config = config

    # ----------------------------------------------------------------- writes
    def append_from_client(self, records, now_ms: int) -> AppendResult:
        try:
            buf = records if isinstance(records, bytearray) else bytearray(records)
            if len(buf) == 0:
                raise KafkaProtocolError(ErrorCode.INVALID_RECORD, "empty record set")
            if rec.magic_of(buf) >= 2:
                rec.validate_record_set(buf)
            else:
                rec.validate_legacy_message_set(buf)
            info = self.log.append(buf, now_ms)
        except KafkaProtocolError as exc:
            return AppendResult(int(exc.code), -1, -1, self._safe_log_start(), str(exc))
        return AppendResult(0, info.first_offset, info.log_append_time, self.log.log_start_offset)

    def _safe_log_start(self) -> int:
        try:
            return self.log.log_start_offset
        except Exception:  # the answer must still go out if the log is unusable
            return -1
