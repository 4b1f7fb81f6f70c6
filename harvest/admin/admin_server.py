"""Runs the admin app on its own port in a daemon thread of the scheduler process."""

import logging
import threading

import uvicorn

from harvest.admin.admin_app import create_admin_app
from harvest.config import AdminConfig

logger = logging.getLogger(__name__)


class AdminServer:
    def __init__(self, runtime, config: AdminConfig):
        self._config = config
        self._server = uvicorn.Server(
            uvicorn.Config(create_admin_app(runtime), host=config.host, port=config.port, log_level="warning",
                           access_log=False)
        )
        self._thread = threading.Thread(target=self._serve, name="harvest-admin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True

    def _serve(self) -> None:
        try:
            self._server.run()
        except Exception:  # a dead admin port must not take serving down with it
            logger.exception("harvest admin server on %s:%d stopped", self._config.host, self._config.port)
