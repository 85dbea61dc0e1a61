"""A customer checks out in a real browser while the workers' ``payments`` breaker opens and
closes: the page says "payments are delayed, your order is queued" exactly while it is open.

The shop's Django app is served from a thread of the test (Django's threaded WSGI server), with
the breakers on Redis under a fresh key prefix (the package's ``resilience_factory``); a second
``Resilience`` on the same prefix plays the workers, which trip and reset the breaker. The web
process learns each change from the change feed: once it knows the breaker, a checkout page
costs no breaker round trip, closed or open. Headless Chromium (Selenium, the system's
chromedriver) places the orders; screenshots go to the test's ``tmp_path``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery_resilience import Resilience
from celery_resilience.breaker import Breaker
from celery_resilience.contrib.pytest import ResilienceHarness

from orders.models import Order

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the test extra
    webdriver = None  # type: ignore[assignment]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
REDIS_URL = os.environ.get("RESILIENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
MISSING = next(
    (f"{p} is missing" for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None),
    None if webdriver is not None else "selenium is not installed (the test extra)",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    # A contributor without Chromium skips; CI installs it, so it fails there instead.
    pytest.mark.skipif(MISSING is not None and not os.environ.get("CI"), reason=MISSING or ""),
]


@pytest.fixture
def site() -> Iterator[str]:
    """The shop's WSGI app on a free loopback port, served from threads of this process."""
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), Quiet)
    server.set_app(get_wsgi_application())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--window-size=1024,768",
        f"--user-data-dir={tmp_path / 'p'}",
    ):
        options.add_argument(flag)  # fmt: skip
    options.binary_location = CHROMIUM
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


class Evals:
    """Breaker scripts this process sends (EVALSHA/EVAL) while ``counting``, counted on the
    web's own client."""

    def __init__(self, breaker: Breaker) -> None:
        client = breaker._store().client  # type: ignore[attr-defined]
        self.count = 0
        self.counting = False
        send = client.execute_command

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += self.counting and str(args[0]).upper().startswith("EVAL")
            return send(*args, **kwargs)

        client.execute_command = counted


def wait(what: str, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_checkout_says_payments_are_delayed_exactly_while_the_breaker_is_open(
    app: Any,
    resilience_factory: Callable[..., ResilienceHarness],
    site: str,
    browser: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the process knows is renewed by a reply at most MAX_KNOWLEDGE_AGE seconds old (the
    # staleness bound, tested with the breaker): a page slower than that on a loaded host asks
    # Redis once, by design. Raised here, so that the count is of the pages alone.
    monkeypatch.setattr("celery_resilience.breaker.knowledge.MAX_KNOWLEDGE_AGE", 60.0)
    app.conf.task_always_eager = False  # the page queues the charge; no worker runs it here
    web = resilience_factory(app, backend="redis", redis_url=REDIS_URL)
    workers = Resilience(app, config=web.resilience.runtime.config)  # the fleet, on the same prefix
    try:
        web_breaker = web.breaker("payments")
        fleet_breaker = workers.breaker("payments")
        shots = iter(range(1, 100))
        evals: Evals | None = None

        def checkout(amount: str) -> str:
            browser.get(f"{site}/checkout/")
            field = browser.find_element(By.ID, "amount")
            field.clear()
            field.send_keys(amount)
            if evals is not None:
                evals.counting = True
            browser.find_element(By.ID, "place-order").click()
            outcome = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "outcome"))
            if evals is not None:
                evals.counting = False
            browser.save_screenshot(str(tmp_path / f"{next(shots):02d}-checkout.png"))
            return f"{outcome.get_attribute('data-outcome')}: {outcome.text}"

        # Closed: a confirmation. The first page teaches the web process the breaker.
        assert checkout("12.50") == "confirmed: Thank you, your order is confirmed"
        # Its change feed goes live in the background; the next page's round trip (as here)
        # teaches the view, and from then on pages read it locally.
        wait("the web process to know the breaker", lambda: known(web_breaker))
        evals = Evals(web_breaker)
        assert checkout("13.00").startswith("confirmed")

        # The workers' failures open it: the web process hears it, and delays its promise.
        for _ in range(5):
            with pytest.raises(ConnectionError):
                fleet_breaker.call(refuse)
        assert fleet_breaker.state == "open"
        wait("the opening to reach the web", lambda: web_breaker.known_state() == "open")
        delayed = checkout("30.00")
        assert delayed == "delayed: Payments are delayed, your order is queued"
        assert checkout("7.25").startswith("delayed")

        # Reset by an operator elsewhere: confirmations again.
        fleet_breaker.reset()
        wait("the reset to reach the web", lambda: web_breaker.known_state() == "closed")
        assert checkout("9.99").startswith("confirmed")
        assert evals.count == 0  # every page after the first read the breaker locally

        amounts = sorted(str(a) for a in Order.objects.values_list("amount", flat=True))
        assert amounts == ["12.50", "13.00", "30.00", "7.25", "9.99"]
        assert set(Order.objects.values_list("status", flat=True)) == {"pending"}  # queued
    finally:
        workers.runtime.close()


def known(breaker: Breaker) -> bool:
    breaker.known_state()
    return breaker._knowledge.known(breaker.name) is not None


def refuse() -> None:
    raise ConnectionError("payment gateway refused the connection")


def test_an_amount_that_is_not_a_number_is_refused_with_the_form_again(
    app: Any, resilience_factory: Callable[..., ResilienceHarness], site: str, browser: Any
) -> None:
    resilience_factory(app, backend="redis", redis_url=REDIS_URL)
    browser.get(f"{site}/checkout/")
    field = browser.find_element(By.ID, "amount")
    field.clear()
    field.send_keys("lots")
    browser.find_element(By.ID, "place-order").click()
    error = WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "error"))
    assert error.text == "Enter an amount above 0."
    assert not Order.objects.exists()
