"""No password shows: a URL's credentials are masked in every error, log line, CLI output (text
and ``--json``) and metric of the package. Each surface is driven with a password-bearing URL;
the secret must appear nowhere, and the masked URL where the text names it."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_resilience import ConfigurationError, Resilience
from celery_resilience.config import ResilienceConfig
from celery_resilience.metrics import serve
from celery_resilience.redact import get_logger, masked_value, redact
from tests.support.cli import Cli
from tests.support.faults import make_user
from tests.support.redis_server import RedisServer, free_port

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
        # base64 secrets hold "/" (and "+", "="); a repr quotes a password with a space or a
        # quote whole; a bytes or quoted option's value runs to its closing quote.
        ("redis://:ab/cd+ef==@h:6379/0", "redis://:***@h:6379/0"),
        ("got 'redis://:a b@h:6379/0'", "got 'redis://:***@h:6379/0'"),
        ("got \"redis://:it's@h/0\" and 'x'", "got \"redis://:***@h/0\" and 'x'"),
        ("{'password': 'x,9;Qw', 'db': 1}", "{'password': '***', 'db': 1}"),
        ("{'password': b'x,9;Qw', 'db': 1}", "{'password': '***', 'db': 1}"),
        ('{"password": "a \\" b"}', '{"password": "***"}'),
        (
            "{'auth': ('user', 'p,w'), 'ssl_keyfile_passphrase': 'p p', 'ssl_password': b'x'}",
            "{'auth': ***, 'ssl_keyfile_passphrase': '***', 'ssl_password': '***'}",
        ),
        ("sentinel_kwargs={'password': 'x y'}", "sentinel_kwargs={'password': '***'}"),
        ("nodes=[{'token': 'x'}]", "nodes=[{'token': '***'}]"),
        # kombu's Azure Storage Queues: the key alone, which may hold "/" too
        (
            "azurestoragequeues://some/key==@acct.queue.core",
            "azurestoragequeues://***@acct.queue.core",
        ),
        ("token=abc123, db=1; token: 'a b', key: 1", "token=***, db=1; token: '***', key: 1"),
        ("resilience_signing_key: key #1 is short", "resilience_signing_key: key #1 is short"),
        (
            "author='Ann', passport=12, can't reach 'x'",
            "author='Ann', passport=12, can't reach 'x'",
        ),
    ],
)
def test_redact_masks_credentials_and_keeps_the_rest(text: str, masked: str) -> None:
    assert redact(text) == masked


def forms(secret: str) -> set[str]:
    """How a text could show ``secret``: as is, in a URL, inside a repr or JSON, as bytes."""
    return {
        secret,
        quote(secret, safe=""),
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        repr(secret.encode())[2:-1],
    }


def leaked(secret: str, *texts: str) -> list[str]:
    return [text for text in texts for form in forms(secret) if form in text]


#: Any characters (no surrogates: they can't be encoded), behind a marker found nowhere else;
#: not "://", which would start a URL of its own in a list.
any_secret = (
    st.text(st.characters(exclude_categories=["Cs"]), min_size=6)
    .map(lambda tail: "Pw" + tail)
    .filter(lambda s: "://" not in s)
)
#: What a URL in running text can hold unquoted: anything but spaces, quotes and a next URL.
url_secret = any_secret.filter(lambda s: not any(c.isspace() or c in "'\";" for c in s))


@settings(max_examples=300, deadline=None)
@given(secret=url_secret)
def test_redact_masks_a_url_password_of_any_characters_in_running_text(secret: str) -> None:
    for url in (f"redis://u:{secret}@h:6379/0", f"redis://:{quote(secret, safe='')}@h/0"):
        text = f"could not reach {url} now; sentinel://:{secret}@h2:26379;redis://h3"
        assert not leaked(secret, redact(text)), redact(text)


@settings(max_examples=300, deadline=None)
@given(secret=any_secret)
def test_redact_masks_any_password_in_a_repr_an_option_or_json(secret: str) -> None:
    """Where a text quotes it (a repr, JSON) a password may hold anything: spaces, quotes,
    "@", "/", ":", "%", non-ASCII, control characters; bytes too."""
    texts = [
        f"got {f'redis://app:{secret}@h:6379/0'!r}",
        repr({"password": secret, "db": 1}),
        repr({"password": secret.encode(), "auth": ("user", secret)}),
        repr({"ssl_keyfile_passphrase": secret, "sentinel_kwargs": {"password": secret}}),
        f"redis options: {json.dumps({'ssl_password': secret, 'token': secret})}",
    ]
    for text in texts:
        assert not leaked(secret, redact(text)), (text, redact(text))


@settings(max_examples=100, deadline=None)
@given(secret=any_secret)
def test_no_error_repr_or_log_line_shows_a_secret_of_the_apps_settings(secret: str) -> None:
    """Once an app's settings are read, its secrets are masked wherever they show, whatever
    their characters: written raw in a URL (a malformed one is an error quoting it), or
    percent-encoded as a client needs them, or as option values (str or bytes)."""
    shown: list[str] = []
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = get_logger("celery_resilience.test.secrets")
    logger.addHandler(handler)
    try:
        for url in (
            f"redis://app:{secret}@127.0.0.1:6379/0",
            f"redis://app:{quote(secret, safe='')}@127.0.0.1:6379/0",
        ):
            for options in (
                {"ssl_password": secret, "sentinel_kwargs": {"password": secret.encode()}},
                {"ssl_keyfile_passphrase": secret.encode(), 1: "not a name"},
                {"auth": secret, "retry": 2},
            ):
                app = Celery("t", broker=url, set_as_current=False)
                app.conf.resilience_redis_options = options
                try:
                    config = ResilienceConfig.from_app(app)
                    shown += [repr(config), repr(config.redis_deployment)]
                except ConfigurationError as exc:
                    shown.append(str(exc))
                logger.error("could not reach %s with %r", url, options)
                try:  # a library's error quoting what it was given
                    raise ValueError(f"cannot parse {url!r} ({options})")
                except ValueError:
                    logger.exception("connecting to %s failed", url)
    finally:
        logger.removeHandler(handler)
    shown.append(stream.getvalue())
    assert not leaked(secret, *shown), shown


def test_a_json_document_stays_json_when_its_secret_named_values_are_masked() -> None:
    """``--json`` output goes through the same masking: a number or a flag beside a name that
    says "key" (a worker's count of signing keys) is masked as a string, not as bare text."""
    data = {"w@host": {"signing_keys": 2, "api_key": None, "password": "p w", "release": "0.4"}}
    masked = json.loads(redact(json.dumps(data, indent=2)))
    assert masked == {
        "w@host": {"signing_keys": "***", "api_key": "***", "password": "***", "release": "0.4"}
    }


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


#: Passwords of the kinds that leaked: base64 (with "/", "+", "="), a space, quotes, "%" and
#: non-ASCII.
AWKWARD = ("c2VjcmV0/K3k+ZXk=", "pass word here", 'it\'s "quoted"', "pä%41ss-wörd")


@pytest.mark.parametrize("secret", AWKWARD)
def test_cli_never_shows_an_awkward_password_written_raw_or_encoded(cli: Any, secret: str) -> None:
    """Written raw (a URL a client can't use: an error that quotes the URL) or percent-encoded
    (as a client needs it) in the URL of an unreachable Redis, and as an option's value."""
    port = free_port()
    raw = f"redis://app:{secret}@127.0.0.1:{port}/0"
    encoded = f"redis://app:{quote(secret, safe='')}@127.0.0.1:{port}/0"
    results = []
    for url in (raw, encoded):
        down = cli(f"redis://127.0.0.1:{port}/0")  # the test's own app reads a valid URL
        down.env["CLIAPP_REDIS"] = url  # the command reads this one
        down.env["CLIAPP_CONF"] = json.dumps({"resilience_redis_options": {"password": secret}})
        results += down.many(("check",), ("check", "--json"), ("status",), ("list", "--json"))
        down.res.runtime.close()
    for result in results:
        assert result.returncode == 1, str(result)
        assert not leaked(secret, result.stdout + result.stderr), str(result)
        assert "Traceback" not in result.stderr, str(result)
    assert any("redis://app:***@127.0.0.1" in r.stdout + r.stderr for r in results)


@pytest.mark.parametrize("secret", AWKWARD)
def test_a_working_app_with_an_awkward_password_never_shows_it(cli: Any, secret: str) -> None:
    with RedisServer() as server:
        admin = server.client()
        make_user(admin, "app", secret)
        admin.close()
        up = cli(f"redis://app:{quote(secret, safe='')}@127.0.0.1:{server.port}/0")
        try:
            up.park(1)
            results = up.many(("status",), ("list",), ("show", up.ids()[0], "--json"), ("check",))
        finally:
            up.res.runtime.close()
    for result in results:
        assert result.returncode in (0, 1), str(result)  # check: no persistence is a warning
        assert not leaked(secret, result.stdout + result.stderr), str(result)


def test_json_output_stays_json_when_a_value_is_named_like_a_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``release --json`` shows what workers answer, their key ids under ``signing_keys``: a
    list, a number or ``null`` named like a secret reads ``"***"``, and the whole still parses."""
    from celery_resilience.cli.output import emit

    url = "redis://app:s3cret@redis:6379/0"
    data = {"w1": {"signing_keys": ["k1"], "token": 7, "auth": None, "release": "0.4"}, "at": url}
    emit(True, data, lambda: "")
    said = json.loads(capsys.readouterr().out)
    shown = {"signing_keys": "***", "token": "***", "auth": None, "release": "0.4"}
    assert said == {"w1": shown, "at": "redis://app:***@redis:6379/0"}


def test_a_pair_named_like_a_secret_is_masked_in_a_setting() -> None:
    options = {"headers": [("Authorization", "Bearer abc"), ("Accept", "json")]}
    assert masked_value(options) == {"headers": [("Authorization", "***"), ("Accept", "json")]}


def test_text_without_a_hint_of_a_credential_is_returned_as_is() -> None:
    text = "dependency down (order 4111111111111111)"
    assert redact(text) is text
