# minipy-mcp (Streamable HTTP, isolated engine) on Debian 12 with CPython 3.11.
#
#   docker build -t minipy-mcp .
#   printf 'alice:%s\n' "$(openssl rand -hex 16)" > tokens    # readable by uid 10001 only:
#   chmod 600 tokens && sudo chown 10001 tokens
#   docker run -d -p 8080:8080 -v "$PWD/tokens:/run/secrets/minipy-tokens:ro" \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined \
#     --cap-drop ALL --security-opt no-new-privileges --stop-timeout 40 minipy-mcp
#
# The three --security-opt flags let the server build its workers' sandbox (user, mount, pid
# namespaces and a fresh /proc) inside the container; docs/deploy.md says why and what the
# Kubernetes equivalents are. The MCP endpoint is http://HOST:8080/mcp; clients send
# "Authorization: Bearer TOKEN" with a token of the file mounted at /run/secrets/minipy-tokens
# (a Docker or Kubernetes secret; the server reads it again on SIGHUP). /healthz, /readyz and
# /metrics need no token.

# --- build: both commands, linked against bookworm's libpython3.11 (cgo) -------------------
FROM golang:1.26-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dev pkg-config gcc \
 && rm -rf /var/lib/apt/lists/*
ENV CGO_ENABLED=1
WORKDIR /src
# Modules first, so that editing the source does not download them again.
COPY go.mod go.sum ./
COPY cmd/minipy-mcp/go.mod cmd/minipy-mcp/go.sum ./cmd/minipy-mcp/
RUN go mod download && cd cmd/minipy-mcp && go mod download
COPY . .
RUN pkg-config --exists python3-embed \
 && go build -trimpath -o /out/minipy ./cmd/minipy \
 && cd cmd/minipy-mcp && go build -trimpath -o /out/minipy-mcp .

# --- runtime ---------------------------------------------------------------------------------
FROM debian:bookworm-slim
# python3 is the workers' interpreter (/usr/bin/python3.11); libpython3.11 holds
# libpython3.11.so.1.0, which both binaries link; the rest is what the model's code may import.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 libpython3.11 python3-numpy python3-pandas python3-matplotlib python3-pil python3-venv tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/minipy /out/minipy-mcp /usr/local/bin/
# A normal user: sandboxed workers run as this uid on the host side (as root the server would
# map them to nobody), so the files they write in their working directory stay this user's.
RUN groupadd --gid 10001 minipy \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/minipy --shell /usr/sbin/nologin minipy
USER 10001:10001
WORKDIR /home/minipy
EXPOSE 8080
# tini is pid 1, and reaps orphans: the sandboxes of a template that died are adopted by
# whatever reaps above the server (docs/isolated.md, "Who may die"), and the server is no
# reaper. It passes SIGTERM on (the server's drain).
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["minipy-mcp", "-http", ":8080", "-backend", "isolated", "-tokens", "/run/secrets/minipy-tokens"]
