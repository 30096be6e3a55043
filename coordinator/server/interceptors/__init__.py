"""The interceptor chain every call passes before its servicer, one module per link.

``app.build_server`` registers them in order (metrics, undecodable, auth, call log, stream
bounds, call shares, version gate, idempotency, write budgets, request ids) and says why that
order; ``handlers`` is what they share (a handler rebuilt around a new behavior).
"""
