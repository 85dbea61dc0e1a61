"""The trust settings: serializer allow-list, signing and encryption keys (no key in errors)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from cryptography.fernet import Fernet

from celery_resilience import ConfigurationError, Resilience
from celery_resilience.checks import run_checks
from celery_resilience.config import ResilienceConfig

pytestmark = pytest.mark.integration

SECRET = "do-not-print-this-secret"


def config(**settings: Any) -> ResilienceConfig:
    app = Celery("trust-settings", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.update({f"resilience_{k}": v for k, v in settings.items()})
    return ResilienceConfig.from_app(app)


def test_the_serializer_comes_from_an_allow_list_whatever_accept_content_says() -> None:
    assert config().serializer == "json"
    assert config(serializer="msgpack").serializer == "msgpack"
    signed = config(serializer="pickle", signing_key=SECRET)
    assert signed.serializer == "pickle"  # named and signed: allowed, with a warning
    with pytest.raises(ConfigurationError, match="resilience_serializer must be one of"):
        config(serializer="yaml")


def test_pickle_as_task_serializer_does_not_make_the_store_unpickle() -> None:
    app = Celery("t", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.task_serializer = "pickle"
    app.conf.accept_content = ["json", "pickle"]
    assert ResilienceConfig.from_app(app).serializer == "json"
    app.conf.task_serializer = "msgpack"
    assert ResilienceConfig.from_app(app).serializer == "msgpack"


def test_keys_take_one_secret_or_a_list_and_never_show_in_a_repr() -> None:
    key = Fernet.generate_key().decode()
    one = config(signing_key=SECRET, encryption_key=key)
    assert (one.signing_keys, one.encryption_keys) == ((SECRET,), (key,))
    many = config(signing_key=[SECRET, SECRET + "-old"])
    assert many.signing_keys == (SECRET, SECRET + "-old")
    assert SECRET not in repr(many)
    assert key not in repr(one)
    assert config(signing_key=None).signing_keys == ()


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"signing_key": "short"}, "resilience_signing_key: key #1 is 5 bytes long"),
        ({"signing_key": [SECRET, 5]}, "resilience_signing_key: key #2 must be a non-empty"),
        ({"signing_key": []}, "resilience_signing_key must be a secret string"),
        ({"encryption_key": SECRET}, "resilience_encryption_key: key #1 is not 32 url-safe base64"),
        ({"encryption_key": [Fernet.generate_key(), SECRET]}, "key #2 is not 32 url-safe"),
    ],
)
def test_a_bad_key_names_the_setting_and_never_the_key(
    settings: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match) as raised:
        config(**settings)
    assert SECRET not in str(raised.value)


def test_a_pickle_store_is_a_start_up_warning() -> None:
    app = Celery("t", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.resilience_serializer = "pickle"
    app.conf.resilience_signing_key = SECRET
    res = Resilience(app)
    try:
        findings = [f for f in run_checks(res.runtime) if "pickle" in f.message]
    finally:
        res.runtime.close()
    assert [f.level for f in findings] == ["warning"]
    assert "signing verifies an entry before it is unpickled" in findings[0].message


def test_a_pickle_store_without_a_signing_key_does_not_start() -> None:
    """Whoever can write one unsigned pickled entry would run code in every reader."""
    with pytest.raises(ConfigurationError) as raised:
        config(serializer="pickle")
    message = str(raised.value)
    assert message.startswith("resilience_serializer = 'pickle' needs resilience_signing_key")
    app = Celery("t", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.resilience_serializer = "pickle"
    from celery_resilience.config.every_error import setting_errors

    errors, read = setting_errors(app.conf)  # ``check`` reports it, the rest is still checked
    assert [str(e) for e in errors] == [message]
    assert read is not None
    assert read.serializer == "json"
