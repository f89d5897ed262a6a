# gpu-topology-extender: the image of the scheduler extender (scheduler-config/extender.yaml runs it) and of the node
# agent (scheduler-config/agent.yaml and agent-deliver.yaml run its other console script, gpu-topology-agent, as
# uid 0 with every capability dropped, for the kubelet's root-owned sockets).
#   docker build -t gpu-topology-extender:0.1.0 .
# Two stages on the same base: the first installs the package into a virtual environment, compiling its C
# extension (extender/api/_names.c) with gcc, the second copies only that environment, so no build tools or sources
# end up in the image.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY topology ./topology
COPY extender ./extender
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install .

FROM python:3.11-slim
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric, non-root user with no entry in /etc/passwd: Kubernetes' runAsNonRoot can only verify a numeric
# USER. 65532 is the conventional "nonroot" id; the extender's Deployment runs as the same. The agents' DaemonSets
# override it with runAsUser: 0.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpu-topology-extender"]
CMD ["serve", "--in-cluster", "--host", "0.0.0.0", "--port", "8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]
