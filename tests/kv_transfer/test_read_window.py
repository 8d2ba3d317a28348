"""A READ's window: what its caller waited, less connection set-up; the wire time inside it;
whether its trace context is sampled."""

from __future__ import annotations

import pytest

from kv_transfer.transport import ReadWindow, TransferResult


def test_the_window_is_the_callers_wait_less_connection_set_up() -> None:
    window = ReadWindow()
    assert window.seconds() == 0.0 and window.wire_seconds() == 0.0  # nothing noted yet
    window.started, window.ended = 10.0, 10.5
    window.setup(0.1)
    window.setup(0.05)
    window.posted, window.completed = 10.2, 10.4
    assert window.seconds() == pytest.approx(0.35)
    assert window.wire_seconds() == pytest.approx(0.2)
    assert TransferResult(700_000_000, 0.6, window.seconds()).gbps == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("traceparent", "traced"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", False),
        ("garbage", False),
        (None, False),
    ],
)
def test_a_read_is_traced_when_its_context_is_sampled(
    traceparent: str | None, traced: bool
) -> None:
    trace = {"traceparent": traceparent} if traceparent is not None else None
    assert ReadWindow(trace).traced is traced
