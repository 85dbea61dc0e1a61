"""``tests.apps.workerapp`` with Celery's remote control on: the app of the rolling upgrade test
(``tests/test_upgrade.py``), loaded by this release's worker and CLI and, copied into its tree,
by the previous release's worker. Remote control is scoped to the test's prefix: kombu's
``global_keyprefix`` prefixes the pidbox's channels and reply queues too.
"""

from __future__ import annotations

import os

from tests.apps.workerapp import make_app

app = make_app(os.environ)
app.conf.worker_enable_remote_control = True
