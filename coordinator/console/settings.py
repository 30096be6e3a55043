"""What the console connects to and the bounds it keeps."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class ConsoleSettings:
    """The coordinator the console talks to, how, and every bound of the web side."""

    # The coordinator's gRPC target (host:port).
    target: str
    # Signs the session cookies (at least 32 bytes; a restart with another key signs everyone
    # out, nothing worse).
    secret_key: str
    # A server started --insecure: people name a principal instead of pasting a token.
    insecure: bool = False
    # Host names the console answers to (console/hosts.py): ignored when insecure (loopback
    # names only); empty otherwise: any.
    allowed_hosts: tuple[str, ...] = ()
    # TLS to the coordinator (None: plaintext, e.g. loopback or a mesh that encrypts).
    channel_credentials: grpc.ChannelCredentials | None = None
    # Mark the session cookie Secure (the console is served over HTTPS, e.g. behind a proxy).
    secure_cookie: bool = False
    # Deadline of one gRPC call made for a page or an action.
    rpc_timeout: float = 5.0
    # Rows per page of a listing (tasks, claims, attempts, effects, events).
    page_size: int = 50
    # Tasks counted per state and queue on the queues page (one ListTasks page each): a queue
    # past it shows "N+" instead of the console paging through the whole keyspace.
    count_cap: int = 1000
    # Largest request body accepted (forms are a few hundred bytes; a pasted token less).
    max_body_bytes: int = 16 * 1024
    # How long a session lasts after sign-in.
    session_seconds: int = 8 * 3600
    # A live event stream is closed after this long; the browser reconnects and resumes after
    # the last event it got (Last-Event-ID), so a stream never holds a thread for ever.
    stream_seconds: float = 60.0
    # Live event streams open at once across every user (each holds one thread and one gRPC
    # stream); past it the stream endpoint answers 503 and the browser retries later.
    max_streams: int = 8
    # Of them, open by one signed-in person at once: one user holding every stream unread locked
    # everyone else's live view out (503), reopening each as it timed out.
    max_streams_per_user: int = 2
