"""tritonserver's keepalive flags as the connection applies them (``server.grpc.keepalive``)."""

from __future__ import annotations

import pytest

from server.grpc import keepalive
from server.grpc.keepalive import KeepalivePings, PingPolicy
from server.settings import GrpcKeepalive


def test_the_third_ping_too_soon_after_the_first_is_too_many_by_default() -> None:
    policy = PingPolicy(GrpcKeepalive())
    assert [policy.too_many(100.0 + i, idle=False) for i in range(4)] == [
        False, False, False, True
    ]


def test_pings_at_the_allowed_interval_are_no_strikes() -> None:
    policy = PingPolicy(GrpcKeepalive(min_recv_ping_interval_without_data_ms=1000))
    assert not any(policy.too_many(10.0 * i, idle=False) for i in range(10))


def test_an_idle_connection_may_ping_every_two_hours_only() -> None:
    policy = PingPolicy(GrpcKeepalive(min_recv_ping_interval_without_data_ms=1000))
    times = [0.0, 10.0, 20.0, 30.0]
    assert [policy.too_many(t, idle=True) for t in times] == [False, False, False, True]
    permitted = PingPolicy(
        GrpcKeepalive(min_recv_ping_interval_without_data_ms=1000, permit_without_calls=True)
    )
    assert not any(permitted.too_many(t, idle=True) for t in times)


def test_data_sent_forgives_the_strikes() -> None:
    policy = PingPolicy(GrpcKeepalive())
    for round_ in range(5):
        assert not policy.too_many(round_ * 1.0, idle=False)
        assert not policy.too_many(round_ * 1.0 + 0.1, idle=False)
        policy.forgive()


def test_no_strike_limit() -> None:
    policy = PingPolicy(GrpcKeepalive(max_ping_strikes=0))
    assert not any(policy.too_many(i * 0.001, idle=True) for i in range(100))


def test_keepalive_pings_need_calls_and_data_between_them() -> None:
    pings = KeepalivePings(GrpcKeepalive(max_pings_without_data=2))
    assert not pings.may_ping(idle=True)
    assert [pings.may_ping(idle=False) for _ in range(3)] == [True, True, False]
    pings.data_sent()
    assert pings.may_ping(idle=False)
    always = KeepalivePings(GrpcKeepalive(permit_without_calls=True, max_pings_without_data=0))
    assert all(always.may_ping(idle=True) for _ in range(10))


@pytest.mark.parametrize("age_ms", [300, 60_000])
def test_connection_age_is_jittered_below_the_flag(age_ms: int) -> None:
    flags = GrpcKeepalive(max_connection_age_ms=age_ms, max_connection_age_grace_ms=5)
    ages = [keepalive.connection_age_s(flags) for _ in range(200)]
    assert all(a is not None and 0.9 * age_ms / 1000 <= a <= age_ms / 1000 for a in ages)
    assert keepalive.connection_age_grace_s(flags) == 0.005
    assert keepalive.connection_age_s(GrpcKeepalive()) is None
