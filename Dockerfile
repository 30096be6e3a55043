# The coordinator's container image: `coordinator serve` as a non-root user on a slim Python.
#
#   docker build -t coordinator:0.1.0 .
#   docker run --rm coordinator:0.1.0 --help
#
# Two stages: the first installs the package and its dependencies (all of them ship wheels, so
# no compiler is needed) into a virtualenv; the final stage copies only that virtualenv onto a
# fresh slim base, without pip, caches or sources. Settings come from the Helm chart's ConfigMap
# (--config) and COORDINATOR_* environment variables; see `coordinator serve --help`.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
RUN python -m venv /opt/coordinator \
    && /opt/coordinator/bin/pip install ".[console]" \
    && /opt/coordinator/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
RUN groupadd --system --gid 10001 coordinator \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin coordinator
COPY --from=build /opt/coordinator /opt/coordinator
ENV PATH=/opt/coordinator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# gRPC (health and reflection included), and the Prometheus metrics port.
EXPOSE 50051 9090
ENTRYPOINT ["coordinator", "serve"]
CMD ["--config", "/etc/coordinator/coordinator.toml"]
