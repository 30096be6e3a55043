"""The SDK's pure core, shared by the sync shell (sdk/client.py, sdk/claim.py, sdk/pool.py, a
thread per keepalive loop) and the asyncio shell (sdk/aio/, a task on the event loop).

No I/O here: no channel is opened, no thread or task started, nothing awaited or slept. What a
call's tries are and when it gives up (``calls``), the requests a worker sends and how a claim
reads their answers (``requests``, ``held``, ``points``), when each claim is renewed and in
which batches (``schedule``), the effect protocol as steps (``effects``), what a pool's options
and endings are (``pool``), its slot accounting (``slots``) and how it ends a claim, as steps
(``settling``), and the protocol helpers work on (``attempt``). The shells only send and wait,
each its own way; tests/sdk/core/ tests this package without a server, and
tests/sdk/test_sdk_layers.py holds the rule that it imports no shell.
"""
