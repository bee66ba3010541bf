# mica images, multi-stage (docs/deploy.md):
#   docker build -t mica .                      # `mica serve` on a slim runtime (default)
#   docker build -t mica-ray --target ray .     # a Ray Serve node with the Python package
#
# Stage `build` compiles the `mica` binary (release profile: thin LTO, one codegen unit);
# `wheel` builds the Python package's abi3 wheel with maturin; `ray` installs that wheel
# and Ray Serve on a Python image, with deploy/ray; `server` (last, the default) copies the
# binary onto Debian slim and runs as an unprivileged user. Models are not in the image:
# mount them at /models (or let `mica pull` fill $MICA_HOME/models).

ARG RUST_IMAGE=rust:1.90-slim-bookworm
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
RUN cargo build --release --locked -p mica-cli --bin mica \
    && install -Dm755 target/release/mica /out/mica

FROM ${RUST_IMAGE} AS wheel
RUN apt-get update && apt-get install -y --no-install-recommends python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /venv && /venv/bin/pip install --no-cache-dir "maturin>=1.9,<2"
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
COPY bindings/python bindings/python
RUN cd bindings/python \
    && /venv/bin/maturin build --release --locked --out /out

FROM ${PYTHON_IMAGE} AS ray
COPY --from=wheel /out/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl "ray[serve]>=2.50" && rm /tmp/*.whl \
    && useradd --uid 10001 --create-home mica
COPY deploy/ray /opt/mica/ray
ENV PYTHONPATH=/opt/mica/ray MICA_HOME=/home/mica/.mica
USER 10001
WORKDIR /opt/mica/ray
EXPOSE 8000
CMD ["serve", "run", "serve-config.yaml"]

FROM ${RUNTIME_IMAGE} AS server
# CA roots for `mica pull` over HTTPS; nothing else is needed at run time.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --home-dir /var/lib/mica mica
COPY --from=build /out/mica /usr/local/bin/mica
ENV MICA_HOME=/var/lib/mica
USER 10001
EXPOSE 8080
ENTRYPOINT ["mica"]
CMD ["serve", "--models-dir", "/models", "--host", "0.0.0.0", "--port", "8080"]
