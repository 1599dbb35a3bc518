"""A task log holds what is worth reading: vLLM's warnings that every eagle-batch engine gets by design (the
chat-template warm-up traceback without a tokenizer, the KV connector notice, ...) are dropped, others kept,
also after vLLM configures its logging when an engine starts."""

from __future__ import annotations

import io
import logging

from eagle_batch.capture import vllm_compat


def test_expected_vllm_warnings_are_dropped_and_others_kept():
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    vllm_compat.quiet_expected_warnings()
    vllm_compat.quiet_expected_warnings()  # idempotent: one filter per logger
    configure_logging(LoggingConfig())  # what an engine's start does: vLLM's handler, its dictConfig
    base = logging.getLogger("vllm.renderers.base")
    assert sum(isinstance(f, vllm_compat._DropExpected) for f in base.filters) == 1
    (handler,) = logging.getLogger("vllm").handlers
    buf = io.StringIO()
    old = handler.setStream(buf)
    try:
        try:
            raise ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
        except ValueError:
            base.warning("Chat template warmup failed", exc_info=True)
        logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.base").warning(
            "Initializing KVConnectorBase_V1. This API is experimental and subject to change"
        )
        logging.getLogger("vllm.config.vllm").warning("max_num_scheduled_tokens is set to %d", 4096)
        base.warning("a renderer warning nobody expects")
    finally:
        handler.setStream(old)
    text = buf.getvalue()
    assert "Traceback" not in text and "Tokenizer not available" not in text and "KVConnectorBase" not in text
    assert "max_num_scheduled_tokens is set to 4096" in text and "a renderer warning nobody expects" in text
