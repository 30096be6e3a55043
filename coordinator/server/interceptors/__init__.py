"""The chain every call passes before its servicer, one module per link.

``app.build_server`` lists the links in order (metrics, undecodable, auth, call log, stream
bounds, call shares, version gate, high-water shares, idempotency, write budgets, request ids)
and says why that order; ``pipeline`` serves them as one gRPC interceptor that builds each
method's handler once (each link decides per call inside the behavior it wraps); ``handlers``
is what the links share (a handler rebuilt around a new behavior).
"""
