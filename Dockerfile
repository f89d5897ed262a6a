# gpu-topology-extender: the image of the scheduler extender (scheduler-config/extender.yaml runs it) and of the node
# agent (scheduler-config/agent.yaml and agent-deliver.yaml run its other console script, gpu-topology-agent, as
# uid 0 with every capability dropped, for the kubelet's root-owned sockets).
#   make image IMAGE=registry.example.com/gpu-topology-extender   (amd64 and arm64, pushed; the tag is the version)
# One image for both architectures: GB200/GB300 trays are Grace (arm64), x86 GPU nodes and control planes amd64.
# Every dependency has a wheel for both (manylinux aarch64 and x86_64, CPython 3.11), so each platform's build
# stage only compiles the one C extension (extender/api/_names.c, portable C) with its own gcc: buildx runs the
# arm64 stage under emulation on an amd64 builder, or natively on an arm64 one.
# Two stages on the same base: the first installs the package into a virtual environment, the second copies only
# that environment, so no build tools or sources end up in the image.
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
EXPOSE 8443 8890
ENTRYPOINT ["gpu-topology-extender"]
CMD ["serve", "--in-cluster", "--host", "0.0.0.0", "--port", "8443", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key"]
