"""Settings: every bad value fails at start with the setting's name and the value; defaults and
derived values (breaker defaults, Django namespace, max_countdown) come out as documented."""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import celery
import pytest
from celery import Celery
from kombu.entity import Exchange, Queue

from celery_resilience import ConfigurationError, Resilience
from celery_resilience.config import BreakerConfig, ResilienceConfig, native_delayed_delivery

pytestmark = pytest.mark.unit

REDIS = "redis://127.0.0.1:6379/15"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"


def make_app(broker: str = REDIS, **settings: Any) -> Celery:
    app = Celery("t", broker=broker, set_as_current=False)
    for name, value in settings.items():
        app.conf[f"resilience_{name}"] = value
    return app


def breaker_setting(option: str) -> str:
    return f"resilience_breakers['payments'][{option!r}]"


class NotAnException:
    pass


# (bad option value, why it is bad) for one breaker's options dict.
BAD_BREAKER_OPTIONS = [
    ("failure_threshold", 0),
    ("failure_threshold", -3),
    ("failure_threshold", True),
    ("failure_threshold", 2.5),
    ("failure_threshold", "5"),
    ("minimum_calls", 0),
    ("minimum_calls", False),
    ("half_open_max_calls", 0),
    ("half_open_max_calls", None),
    ("failure_rate_threshold", 0),
    ("failure_rate_threshold", 1.5),
    ("failure_rate_threshold", -0.1),
    ("failure_rate_threshold", True),
    ("failure_rate_threshold", math.nan),
    ("failure_rate_threshold", "0.5"),
    ("window", 0),
    ("window", -1.0),
    ("window", "60"),
    ("window", math.nan),
    ("window", math.inf),
    ("open_timeout", 0.0),
    ("open_timeout", math.inf),
    ("open_timeout", [30]),
    ("open_timeout_max", -math.inf),
    ("probe_lease", 0),
    ("max_concurrent_calls", 0),
    ("max_concurrent_calls", True),
    ("max_concurrent_calls", 2.5),
    ("call_lease", 0),
    ("call_lease", None),
    ("slow_call_seconds", -0.5),
    ("slow_call_seconds", True),
    ("ignore", 42),
    ("ignore", None),
    ("ignore", NotAnException),
    ("ignore", "os.path"),
    ("ignore", "no_such_module_xyz.Error"),
    ("ignore", "builtins.NoSuchError"),
    ("ignore", "..relative.Error"),
    ("ignore", (ValueError, "no_such_module_xyz.Error")),
    ("retry_budget", 1.5),
    ("retry_budget", -0.1),
    ("retry_budget", "10%"),
    ("retry_budget", True),
    ("min_retries_per_second", -1),
    ("min_retries_per_second", math.nan),
    ("min_retries_per_second", math.inf),
    ("min_retries_per_second", None),
    ("rate_limit", "100/d"),
    ("rate_limit", "0/s"),
    ("rate_limit", "-5/m"),
    ("rate_limit", "fast"),
    ("rate_limit", "inf/s"),
    ("rate_limit", "1e-300/s"),  # slower than one call a day
    ("rate_limit", "0.04/h"),
    ("rate_limit", ""),
    ("rate_limit", 100),
    ("rate_limit", True),
]


@pytest.mark.parametrize(("option", "value"), BAD_BREAKER_OPTIONS)
def test_a_bad_breaker_option_names_the_breaker_option_and_shows_the_value(
    option: str, value: Any
) -> None:
    app = make_app(breakers={"payments": {option: value}})
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    message = str(info.value)
    assert breaker_setting(option) in message
    shown = value[-1] if isinstance(value, tuple) else value
    assert repr(shown) in message


@pytest.mark.parametrize(
    ("option", "value"),
    [("failure_threshold", 0), ("window", "1m"), ("max_concurrent_calls", -1)],
)
def test_a_bad_breaker_default_names_resilience_breaker_defaults(option: str, value: Any) -> None:
    app = make_app(breaker_defaults={option: value})
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    assert f"resilience_breaker_defaults[{option!r}]" in str(info.value)
    assert repr(value) in str(info.value)


def test_the_bulkhead_is_off_by_default_and_breaker_defaults_turn_it_on_for_every_breaker() -> None:
    assert BreakerConfig().max_concurrent_calls is None
    app = make_app(
        breaker_defaults={"max_concurrent_calls": 4, "call_lease": 30},
        breakers={"payments": {}, "search": {"max_concurrent_calls": 2}},
    )
    res = Resilience(app)
    payments, search = res.breaker("payments").config, res.breaker("search").config
    assert (payments.max_concurrent_calls, payments.call_lease) == (4, 30.0)
    assert (search.max_concurrent_calls, search.call_lease) == (2, 30.0)


def test_an_unknown_breaker_option_is_named() -> None:
    app = make_app(breakers={"payments": {"failure_treshold": 3}})
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    assert "resilience_breakers['payments']" in str(info.value)
    assert "'failure_treshold'" in str(info.value)


def test_an_unknown_option_in_breaker_defaults_is_named() -> None:
    app = make_app(breaker_defaults={"timeout": 3})
    with pytest.raises(ConfigurationError, match=r"resilience_breaker_defaults.*'timeout'"):
        Resilience(app)


def test_open_timeout_max_below_open_timeout_is_rejected() -> None:
    app = make_app(breakers={"payments": {"open_timeout": 30.0, "open_timeout_max": 10.0}})
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    assert breaker_setting("open_timeout_max") in str(info.value)
    assert "10.0" in str(info.value)


def test_open_timeout_max_below_a_declared_open_timeout_inherited_from_defaults_is_rejected() -> (
    None
):
    app = make_app(
        breaker_defaults={"open_timeout_max": 60.0}, breakers={"payments": {"open_timeout": 90.0}}
    )
    with pytest.raises(ConfigurationError, match=r"open_timeout_max"):
        Resilience(app)


_SAME = object()

# (setting without its prefix, bad value, the value the message must show if not the same)
BAD_TOP_LEVEL = [
    ("breakers", [{"payments": {}}], _SAME),
    ("breakers", "payments", _SAME),
    ("breakers", {"payments": 5}, 5),
    ("breakers", {"": {}}, ""),
    ("breakers", {"pay{ments}": {}}, "pay{ments}"),
    ("breaker_defaults", ["failure_threshold", 3], _SAME),
    ("redis_url", "http://x", _SAME),
    ("redis_url", "redis://host:notaport", _SAME),
    ("redis_url", "redis://", _SAME),
    ("redis_url", 6379, _SAME),
    ("redis_timeout", 0, _SAME),
    ("redis_timeout", math.nan, _SAME),
    ("redis_timeout", "0.5", _SAME),
    ("on_redis_error", "ignore", _SAME),
    ("on_redis_error", None, _SAME),
    ("on_redis_error", True, _SAME),
    ("key_prefix", "", _SAME),
    ("key_prefix", 5, _SAME),
    ("max_countdown", 0, _SAME),
    ("max_countdown", math.inf, _SAME),
    ("max_countdown", "3600", _SAME),
    ("max_deliveries", 0, _SAME),
    ("dedup_ttl", -1, _SAME),
    ("dedup_lease", 0, _SAME),
    ("drain_batch", True, _SAME),
    ("drain_batch", 10.0, _SAME),
    ("drain_rate", 0, _SAME),
    ("max_replays", -1, _SAME),
    ("dead_ttl", math.nan, _SAME),
    ("backout_max_entries", 0, _SAME),
]


@pytest.mark.parametrize(("name", "value", "shown"), BAD_TOP_LEVEL)
def test_a_bad_top_level_setting_names_the_setting_and_shows_the_value(
    name: str, value: Any, shown: Any
) -> None:
    app = make_app(**{name: value})
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    message = str(info.value)
    assert f"resilience_{name}" in message
    assert repr(value if shown is _SAME else shown) in message


def test_without_resilience_redis_url_an_amqp_broker_is_an_error_naming_the_setting() -> None:
    app = make_app(broker=AMQP)
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    assert "resilience_redis_url" in str(info.value)
    # The broker is named, its password masked.
    assert "amqp://guest:***@127.0.0.1:5672//" in str(info.value)
    assert "guest@" not in str(info.value)


def test_without_resilience_redis_url_a_redis_broker_is_used() -> None:
    assert ResilienceConfig.from_app(make_app()).redis_url == REDIS


def test_an_explicit_redis_url_wins_over_the_broker() -> None:
    url = "redis://127.0.0.1:6379/3"
    assert ResilienceConfig.from_app(make_app(broker=AMQP, redis_url=url)).redis_url == url


def test_a_configuration_error_is_a_value_error_for_callers_that_catch_those() -> None:
    with pytest.raises(ValueError, match="resilience_redis_timeout"):
        Resilience(make_app(redis_timeout=-1))


def test_defaults_apply_to_undeclared_breakers_and_are_merged_under_declared_ones() -> None:
    config = ResilienceConfig.from_app(
        make_app(
            breaker_defaults={"failure_threshold": 9, "open_timeout": 12.0, "ignore": [KeyError]},
            breakers={"payments": {"failure_threshold": 2}},
        )
    )
    undeclared = config.breaker("enrichment")
    assert (undeclared.failure_threshold, undeclared.open_timeout) == (9, 12.0)
    assert undeclared.ignore == (KeyError,)
    declared = config.breaker("payments")
    assert declared.failure_threshold == 2  # its own value wins
    assert declared.open_timeout == 12.0  # the rest comes from the defaults
    assert declared.ignore == (KeyError,)
    assert declared.half_open_max_calls == BreakerConfig().half_open_max_calls


def test_resilience_breaker_uses_the_merged_settings() -> None:
    resilience = Resilience(
        make_app(breaker_defaults={"open_timeout": 7.0}, breakers={"payments": {}})
    )
    assert resilience.breaker("payments").config.open_timeout == 7.0
    assert resilience.breaker("anything").config.open_timeout == 7.0


def test_ignore_accepts_classes_and_dotted_paths() -> None:
    config = ResilienceConfig.from_app(
        make_app(breakers={"payments": {"ignore": ["KeyError", "json.JSONDecodeError", OSError]}})
    )
    import json

    assert config.breaker("payments").ignore == (KeyError, json.JSONDecodeError, OSError)


def test_settings_under_a_django_style_namespace_are_read() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = REDIS
        CELERY_RESILIENCE_BREAKERS: ClassVar = {"payments": {"failure_threshold": 7}}
        CELERY_RESILIENCE_ON_REDIS_ERROR = "fail_closed"
        CELERY_RESILIENCE_KEY_PREFIX = "shop"

    app = Celery("t", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    config = Resilience(app).runtime.config
    assert config.breaker("payments").failure_threshold == 7
    assert config.on_redis_error == "fail_closed"
    assert config.key_prefix == "shop"
    assert config.redis_url == REDIS


def test_a_bad_setting_under_a_django_namespace_is_still_rejected() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = REDIS
        CELERY_RESILIENCE_BREAKERS: ClassVar = {"payments": {"failure_threshold": 0}}

    app = Celery("t", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    with pytest.raises(ConfigurationError, match="failure_threshold"):
        Resilience(app)


def test_settings_are_not_written_into_app_conf() -> None:
    app = make_app()
    Resilience(app)
    assert app.conf.get("resilience_redis_timeout") is None
    assert app.conf.get("resilience_breakers") is None


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({}, 0.9 * 3600),
        ({"broker_transport_options": {"visibility_timeout": 600}}, 0.9 * 600),
        (
            {
                "broker_transport_options": {"visibility_timeout": 600},
                "result_backend_transport_options": {"visibility_timeout": 300},
                "visibility_timeout": 900,
            },
            0.9 * 300,
        ),
        (
            {
                "broker_transport_options": {"visibility_timeout": 600},
                "result_backend_transport_options": {"visibility_timeout": 700},
                "visibility_timeout": 200,
            },
            0.9 * 200,
        ),
        ({"broker_transport_options": {"max_retries": 3}}, 0.9 * 3600),
    ],
)
def test_max_countdown_defaults_to_nine_tenths_of_the_shortest_visibility_timeout(
    conf: dict[str, Any], expected: float
) -> None:
    app = make_app()
    app.conf.update(conf)
    assert Resilience(app).runtime.config.max_countdown == pytest.approx(expected)


def test_max_countdown_with_an_amqp_broker_stays_below_rabbitmqs_consumer_timeout() -> None:
    app = make_app(broker=AMQP, redis_url=REDIS)
    assert Resilience(app).runtime.config.max_countdown == pytest.approx(0.9 * 1800)


#: Celery's native delayed delivery on RabbitMQ (Celery 5.5 and kombu 5.5 or later).
NATIVE = celery.VERSION >= (5, 5)


def quorum(name: str, exchange_type: str) -> Any:
    """A quorum queue behind an exchange of its own of ``exchange_type``."""
    exchange = cast(Any, Exchange)(name, exchange_type)  # kombu's annotations vary by release
    arguments = {"x-queue-type": "quorum"}
    return cast(Any, Queue)(name, exchange, queue_arguments=arguments)


@pytest.mark.parametrize(
    ("conf", "natively"),
    [
        ({"task_default_queue_type": "quorum", "task_default_exchange_type": "topic"}, NATIVE),
        ({"task_default_queue_type": "quorum", "task_default_exchange_type": "fanout"}, NATIVE),
        # Celery sends a countdown through a direct exchange the old way.
        ({"task_default_queue_type": "quorum"}, False),
        ({"task_default_exchange_type": "topic"}, False),  # classic queues
        ({"task_queues": [quorum("a", "topic"), quorum("b", "topic")]}, NATIVE),
        # One queue a countdown could reach the old way: the worker's limit stands.
        ({"task_queues": [quorum("a", "topic"), quorum("b", "direct")]}, False),
    ],
)
def test_max_countdown_on_rabbitmq_follows_celerys_native_delayed_delivery(
    conf: dict[str, Any], natively: bool
) -> None:
    app = make_app(broker=AMQP, redis_url=REDIS)
    app.conf.update(conf)
    config = Resilience(app).runtime.config

    assert native_delayed_delivery(app.conf) is natively
    limit = 2**28 - 1 if natively else 1800
    assert config.max_countdown == pytest.approx(0.9 * limit)
    # A worker still holds a delivered message unacked for the consumer timeout at most.
    assert config.broker_redelivery_after == 1800


def test_a_redis_broker_never_counts_on_native_delayed_delivery() -> None:
    app = make_app()
    app.conf.update(task_default_queue_type="quorum", task_default_exchange_type="topic")
    assert not native_delayed_delivery(app.conf)
    assert Resilience(app).runtime.config.max_countdown == pytest.approx(0.9 * 3600)


def test_an_explicit_max_countdown_is_kept() -> None:
    app = make_app(max_countdown=120)
    app.conf.broker_transport_options = {"visibility_timeout": 60}
    assert Resilience(app).runtime.config.max_countdown == 120.0


def test_a_valid_configuration_is_frozen() -> None:
    config = Resilience(make_app(breakers={"payments": {}})).runtime.config
    with pytest.raises(AttributeError):
        config.redis_timeout = 1.0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.breaker("payments").failure_threshold = 1  # type: ignore[misc]
