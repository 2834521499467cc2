"""Postgres connections whose waits for the server end at the store work's deadline.

psycopg 3 drives every exchange with the server (a statement, a fetch, a commit, SQLAlchemy's
pre-ping) through `Connection.wait`, which polls the socket; it accepts a timeout. Where the
work running in this thread has a deadline (reef.store.deadline), the wait gets what is left of
it. A wait that reaches the deadline has sent a request the server never answered, so the
connection is unusable: its socket is shut down and the connection closed, here, by the thread
that was waiting (no other thread touches it, so no file descriptor can have been reused
meanwhile), and an OperationalError is raised. psycopg then reports the connection `closed`,
which SQLAlchemy's psycopg dialect takes for a disconnect: the connection is invalidated and
the pool opens a new one for the next checkout (after pre-pinging the others).

What the server does with what it had received is its own: a COMMIT that reached a frozen
server's socket is carried out when the server thaws, after its client gave up. A record
written so was never acknowledged (its call was answered 503), which is allowed; the converse,
an acknowledged record that is not stored, is what must never happen.

Work without a deadline waits as psycopg always does: no timeout, nothing closed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
from typing import Any

import psycopg

from reef.store import deadline

log = logging.getLogger(__name__)


class DeadlineConnection(psycopg.Connection[Any]):
    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        due = deadline.current()
        if due is None:
            return super().wait(gen, interval=interval, timeout=timeout)
        left = max(due.left(), 0.0)
        ours = timeout is None or left < timeout
        try:
            return super().wait(gen, interval=interval, timeout=left if ours else timeout)
        except psycopg.OperationalError as e:
            # psycopg's own timeout error (_WaitTimeout, private: matched by name); anything
            # else (the server gone, the connection lost) is psycopg's to report as it is.
            if not ours or type(e).__name__ != "_WaitTimeout" or self.closed:
                raise
            self._break()
            log.warning(
                "closed a connection to the database: no answer within %g s (store.deadline_s)",
                due.seconds,
            )
            raise psycopg.OperationalError(
                f"no answer from the server within the deadline ({due.seconds:g} s): "
                "connection closed"
            ) from e

    def _break(self) -> None:
        """Shut the socket down (so nothing sent now can block on a peer that reads nothing),
        then close the connection."""
        with (
            contextlib.suppress(OSError, psycopg.Error),
            socket.socket(fileno=os.dup(self.pgconn.socket)) as sock,
        ):
            sock.shutdown(socket.SHUT_RDWR)
        self.close()


def connect(*cargs: Any, **cparams: Any) -> DeadlineConnection:
    """A new connection (SQLAlchemy's do_connect hook): under a deadline, connect_timeout is
    what is left of it (libpq's least, 2 s, at the end), so a server whose kernel still takes
    connections but that never answers one fails it in time too."""
    due = deadline.current()
    if due is not None:
        configured = float(cparams.get("connect_timeout") or math.inf)
        cparams = {**cparams, "connect_timeout": max(2, math.ceil(min(configured, due.left())))}
    return DeadlineConnection.connect(*cargs, **cparams)
