"""No password shows: a URL's credentials are masked in every error, log line, CLI output (text
and ``--json``) and metric of the package. Each surface is driven with a password-bearing URL;
the secret must appear nowhere, and the masked URL where the text names it."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery

from celery_resilience import ConfigurationError, Resilience
from celery_resilience.metrics import serve
from celery_resilience.redact import get_logger, redact
from tests.support.faults import make_user
from tests.support.redis_server import RedisServer, free_port
from tests.test_cli import Cli

pytestmark = pytest.mark.integration

#: A password with "@" and ":" in it, as people write them in URLs (unencoded): the URL's
#: credentials end at its last "@". No piece of it may show anywhere.
SECRET = "s3c@r3t:pw-t41l"
PIECES = ("s3c", "r3t", "pw-t41l")


def shows_secret(text: str) -> bool:
    return any(piece in text for piece in PIECES)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://:s3cret-pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("amqp://guest:s3cret-pw@mq:5672//", "amqp://guest:***@mq:5672//"),
        (
            "sentinel://:s3cret-pw@a:26379;sentinel://:s3cret-pw@b:26379",
            "sentinel://:***@a:26379;sentinel://:***@b:26379",
        ),
        ("{'password': 's3cret-pw', 'db': 1}", "{'password': '***', 'db': 1}"),
        ("rediss://u:s3cret-pw@h/0?ssl_cert_reqs=none", "rediss://u:***@h/0?ssl_cert_reqs=none"),
        ("nothing to hide: redis://h:6379/0", "nothing to hide: redis://h:6379/0"),
        ("redis://:p@ssTail@host", "redis://:***@host"),
        ("redis://u:p@ss:w@rd@h:6379/0 and a@b", "redis://u:***@h:6379/0 and a@b"),
        (
            "sentinel://:a@b:c@h1:26379;sentinel://:a@b:c@h2:26379",
            "sentinel://:***@h1:26379;sentinel://:***@h2:26379",
        ),
        ("{'password': 'p@ss:w', 'db': 1}", "{'password': '***', 'db': 1}"),
        ("'redis://:p@ss@h/0', 'x@y'", "'redis://:***@h/0', 'x@y'"),
    ],
)
def test_redact_masks_credentials_and_keeps_the_rest(text: str, masked: str) -> None:
    assert redact(text) == masked


def test_a_configuration_error_never_shows_the_password() -> None:
    app = Celery("t", broker=f"amqp://guest:{SECRET}@127.0.0.1:5672//", set_as_current=False)
    with pytest.raises(ConfigurationError) as info:  # the broker is not Redis: named, masked
        Resilience(app)
    assert not shows_secret(str(info.value))
    assert "amqp://guest:***@127.0.0.1:5672//" in str(info.value)

    app.conf.resilience_redis_url = f"redis://:{SECRET}@127.0.0.1:notaport/0"
    with pytest.raises(ConfigurationError) as info:
        Resilience(app)
    assert not shows_secret(str(info.value))
    assert "redis://:***@127.0.0.1:notaport/0" in str(info.value)


def test_log_lines_and_their_tracebacks_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    logger = get_logger("celery_resilience.test")
    caplog.set_level(logging.INFO, logger="celery_resilience.test")
    logger.error("could not reach %s", f"redis://:{SECRET}@h:6379/0")
    try:
        raise ConnectionError(f"no answer from amqp://u:{SECRET}@mq//")
    except ConnectionError:
        logger.exception("publishing failed")
    text = "\n".join(caplog.text.splitlines())
    assert not shows_secret(text)
    assert "redis://:***@h:6379/0" in text
    assert "amqp://u:***@mq//" in text


@pytest.fixture
def unreachable_url() -> str:
    return f"redis://app:{SECRET}@127.0.0.1:{free_port()}/0"


def test_an_outage_logged_by_the_breaker_and_the_clock_is_masked(
    unreachable_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("t", broker=unreachable_url, set_as_current=False)
    app.conf.resilience_redis_timeout = 0.2
    resilience = Resilience(app)
    caplog.set_level(logging.DEBUG, logger="celery_resilience")
    assert resilience.breaker("dep").call(lambda: 1) == 1  # fail_open
    resilience.runtime.now()
    assert "Redis unreachable" in caplog.text
    assert "Redis TIME unavailable" in caplog.text
    assert not shows_secret(caplog.text)


@pytest.fixture
def locked_redis() -> Iterator[RedisServer]:
    """A private Redis whose user ``app`` logs in with ``SECRET``."""
    with RedisServer() as server:
        admin = server.client()
        make_user(admin, "app", SECRET)
        admin.close()
        yield server


@pytest.fixture
def cli(key_prefix: str, redis_url: str, redis_client: Any) -> Callable[[str], Cli]:
    def make(resilience_url: str) -> Cli:
        env = {
            "CLIAPP_PREFIX": key_prefix,
            "CLIAPP_BROKER": redis_url,
            "CLIAPP_REDIS": resilience_url,
            "CLIAPP_QUEUE": f"{key_prefix}-queue",
        }
        return Cli(env, redis_client)

    return make


def test_cli_errors_text_and_json_never_show_the_password(cli: Any, unreachable_url: str) -> None:
    down = cli(unreachable_url)
    results = down.many(("check",), ("check", "--json"), ("status",), ("status", "--json"))
    for result in results:
        assert result.returncode == 1, str(result)
        assert not shows_secret(result.stdout + result.stderr), str(result)
        assert "Traceback" not in result.stderr, str(result)
    check_text, check_json = results[0], results[1]
    assert f"redis://app:***@127.0.0.1:{unreachable_url.rsplit(':', 1)[1]}" in check_text.stdout
    assert any("redis://app:***@" in f["message"] for f in check_json.json())


def test_cli_output_and_metrics_of_a_working_app_never_show_the_password(
    cli: Any, locked_redis: RedisServer
) -> None:
    url = f"redis://app:{SECRET}@127.0.0.1:{locked_redis.port}/0"
    up = cli(url)
    up.park(1)
    for result in up.many(("status",), ("status", "--json"), ("list", "--json"), ("check",)):
        assert result.returncode in (0, 1), str(result)  # check: no persistence is a warning
        assert not shows_secret(result.stdout + result.stderr), str(result)

    port = free_port()
    server, thread = serve(up.res, port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    assert "celery_resilience_backout_entries" in scraped
    assert not shows_secret(scraped)
