"""The SDK conformance suite: scenarios (``conformance/scenarios/*.json``) that every SDK's driver
runs against a real coordinator, and the Python SDK's driver (``python -m
conformance.driver_py``). The protocol a driver speaks is ``conformance/PROTOCOL.md``; the
harness that runs the scenarios is ``tests/conformance/``."""
