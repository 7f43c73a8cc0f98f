"""The service's pull-task endpoints over HTTP, each call retried while the service cannot answer.

Every call may be repeated safely: the service fences each task id, so a
completion that landed before its answer was lost answers ``409
lease_lost`` when repeated, and is never applied twice. What may be retried
is therefore decided by the answer alone: no answer (connection refused or
reset, timeout) or a status in :data:`TRANSIENT` (503 during a database
outage, 502/504 from a proxy during a restart) is retried with capped,
jittered exponential backoff, for as long as the caller's ``keep_trying``
says (a task's lease, the worker's life).
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import logging
import random
import socket
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from routemaster import __version__

logger = logging.getLogger(__name__)

TRANSIENT = frozenset({429, 500, 502, 503, 504})
FIRST_DELAY = 0.1  # seconds before the first retry
MAX_DELAY = 5.0  # seconds between retries at most
TIMEOUT = 10.0  # seconds for every call but a waiting claim
WAIT_MARGIN = 10.0  # a waiting claim's timeout is its wait plus this


class Unanswered(Exception):
    """No answer: the connection was refused, reset or timed out (or the claim cancelled)."""


@dataclass(frozen=True)
class Reply:
    """An answer: its status and its JSON body (``{"message": ...}`` if it was not JSON)."""

    status: int
    body: dict[str, Any]
    path: str

    @property
    def problem(self) -> str:
        return f"{self.status} {self.body.get('message', '')}".strip()


class ClaimConnection:
    """The connection claims go on, apart from the session's pool, so that a worker shutting
    down can half-close it (:meth:`cancel`): the service then answers a waiting claim at once
    and claims nothing more for it, while an answer already on its way can still be read."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urllib.parse.urlsplit(url)
        self._secure = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {**headers, "Content-Type": "application/json"}
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._cancelled = False

    def post(self, path: str, body: dict[str, Any], timeout: float) -> Reply:
        with self._lock:
            if self._cancelled:
                raise Unanswered("the claim was cancelled")
            if self._connection is None:
                kind = http.client.HTTPSConnection if self._secure else http.client.HTTPConnection
                self._connection = kind(self._host, self._port, timeout=timeout)
            connection = self._connection
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
        try:
            connection.request(
                "POST", self._prefix + path, body=json.dumps(body), headers=self._headers
            )
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            self._drop(connection)
            raise Unanswered(f"{type(error).__name__}: {error}") from None
        if response.will_close:
            self._drop(connection)
        return Reply(response.status, _json(data), path)

    def cancel(self) -> None:
        """No more claims; the one in flight, if any, half-closed (its answer still read)."""
        with self._lock:
            self._cancelled = True
            connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _drop(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._connection is connection:
                self._connection = None
        connection.close()


class Refused(Exception):
    """The service refused a request for good (a 4xx other than ``lease_lost``): the worker's
    configuration is wrong (no such pull action, a token without the ``work`` scope)."""


@dataclass(frozen=True)
class Answer:
    """What the service said of one task id: done (200), or its lease lost (409, or 404)."""

    task_id: str
    ok: bool
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


def backoff(attempt: int, rng: random.Random) -> float:
    """Seconds before retry ``attempt`` (0-based): doubling from 0.1 s to 5 s, full jitter
    in its upper half so that many workers coming back do not arrive together."""
    ceiling: float = min(MAX_DELAY, FIRST_DELAY * 2.0 ** min(attempt, 10))
    return ceiling / 2 + rng.random() * ceiling / 2


class Service:
    """One thread's connection to the service (a ``requests.Session`` is not shared between
    threads), and its own connection for claims. ``stopping`` cuts every backoff short when
    the worker must stop at once."""

    def __init__(self, url: str, token: str | None, stopping: threading.Event) -> None:
        self.url = url.rstrip("/")
        self.stopping = stopping
        headers = {"User-Agent": f"routemaster-client/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.session = requests.Session()
        self.session.headers.update(headers)
        self.claims = ClaimConnection(self.url, headers)
        self._rng = random.Random()

    def close(self) -> None:
        self.session.close()
        self.claims.close()

    def claim(
        self, claim: dict[str, Any], keep_trying: Callable[[], bool]
    ) -> list[dict[str, Any]] | None:
        """``POST /tasks/claim``: the tasks claimed (maybe none); ``None`` when given up."""
        timeout = float(claim.get("wait", 0)) + WAIT_MARGIN
        reply = self._post("/tasks/claim", claim, timeout, keep_trying, claiming=True)
        if reply is None:
            return None
        tasks: list[dict[str, Any]] = _refused_unless_ok(reply)["tasks"]
        return tasks

    def complete(
        self,
        completions: Sequence[dict[str, Any]],
        claim: dict[str, Any] | None,
        keep_trying: Callable[[], bool],
    ) -> tuple[list[Answer], list[dict[str, Any]]] | None:
        """``POST /tasks/complete``: each completion's answer, in order, and the tasks claimed
        after them (with ``claim``); ``None`` when given up."""
        body: dict[str, Any] = {"tasks": list(completions)}
        if claim is not None:
            body["claim"] = claim
        timeout = float((claim or {}).get("wait", 0)) + WAIT_MARGIN
        reply = self._post(
            "/tasks/complete", body, timeout, keep_trying, claiming=claim is not None
        )
        if reply is None:
            return None
        answer = _refused_unless_ok(reply)
        done = [Answer(entry["id"], entry["status"] == 200, entry) for entry in answer["completed"]]
        return done, answer["tasks"]

    def fail(
        self,
        task_id: str,
        error: str,
        *,
        retry: bool,
        retry_after: float | None,
        keep_trying: Callable[[], bool],
    ) -> Answer | None:
        """``POST /tasks/{id}/fail``."""
        body: dict[str, Any] = {"error": error, "retry": retry}
        if retry_after is not None:
            body["retry_after"] = retry_after
        return self._task_call(task_id, "fail", body, keep_trying)

    def release(self, task_id: str, keep_trying: Callable[[], bool]) -> Answer | None:
        """``POST /tasks/{id}/release``: due again at once, no attempt counted."""
        return self._task_call(task_id, "release", {}, keep_trying)

    def heartbeat(self, task_id: str) -> Answer | str:
        """``POST /tasks/{id}/heartbeat`` tried once: the answer, or why there was none (the
        caller retries on its own schedule, so that one lease's trouble holds up no other)."""
        try:
            reply = self._exchange(f"/tasks/{task_id}/heartbeat", {}, TIMEOUT)
        except Unanswered as error:
            return str(error)
        if reply.status in TRANSIENT:
            return reply.problem
        return _task_answer(task_id, reply)

    def _task_call(
        self, task_id: str, verb: str, body: dict[str, Any], keep_trying: Callable[[], bool]
    ) -> Answer | None:
        reply = self._post(f"/tasks/{task_id}/{verb}", body, TIMEOUT, keep_trying)
        return None if reply is None else _task_answer(task_id, reply)

    def _post(
        self,
        path: str,
        body: dict[str, Any],
        timeout: float,
        keep_trying: Callable[[], bool],
        *,
        claiming: bool = False,
    ) -> Reply | None:
        """The first answer that is not transient; ``None`` once ``keep_trying()`` is false or
        the worker stops at once."""
        attempt = 0
        while True:
            try:
                if claiming:
                    reply = self.claims.post(path, body, timeout)
                else:
                    reply = self._exchange(path, body, timeout)
            except Unanswered as error:
                problem = str(error)
            else:
                if reply.status not in TRANSIENT:
                    return reply
                problem = reply.problem
            if self.stopping.is_set() or not keep_trying():
                logger.info("POST %s: %s; given up", _shown(path), problem)
                return None
            delay = backoff(attempt, self._rng)
            level = logging.WARNING if attempt % 10 == 0 else logging.DEBUG
            logger.log(level, "POST %s: %s; retrying in %.1f s", _shown(path), problem, delay)
            attempt += 1
            if self.stopping.wait(delay):
                return None

    def _exchange(self, path: str, body: dict[str, Any], timeout: float) -> Reply:
        try:
            response = self.session.post(self.url + path, json=body, timeout=timeout)
        except requests.RequestException as error:
            raise Unanswered(f"{type(error).__name__}: {error}") from None
        return Reply(response.status_code, _json(response.content), path)


def _shown(path: str) -> str:
    """The path without a task id: ids are secrets for their lease's lifetime."""
    parts = path.split("/")
    return "/tasks/{id}/" + parts[-1] if len(parts) == 4 else path


def _json(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        return {"message": data[:200].decode("utf-8", "replace")}
    return body if isinstance(body, dict) else {"message": str(body)[:200]}


def _refused_unless_ok(reply: Reply) -> dict[str, Any]:
    if reply.status != 200:
        raise Refused(f"{_shown(reply.path)}: {reply.problem}")
    return reply.body


def _task_answer(task_id: str, reply: Reply) -> Answer:
    """200: done; 409 (``lease_lost``) or 404 (never issued): the lease is not ours."""
    if reply.status in (200, 404, 409):
        return Answer(task_id, reply.status == 200, reply.body)
    raise Refused(f"{_shown(reply.path)}: {reply.problem}")


def expiry_in(expires_at: datetime.datetime) -> float:
    """Seconds from now until ``expires_at`` by this machine's clock (at least 0)."""
    return max((expires_at - datetime.datetime.now(datetime.UTC)).total_seconds(), 0.0)
