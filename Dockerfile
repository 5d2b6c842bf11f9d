# syntax=docker/dockerfile:1
# The snapcoord coordinator image: slim, multi-stage, non-root.
#   docker build -t snapcoord .
#   docker run -p 50051:50051 -p 9464:9464 snapcoord serve            (embedded storage in /var/lib/snapcoord)
# Production: set SNAPCOORD_METADATA=zk://... and SNAPCOORD_BLOBS=s3://... (see docker-compose.yml).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN python -m pip install --no-cache-dir --upgrade pip build
COPY client/ client/
COPY coordinator/ coordinator/
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels ./client ./coordinator

FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SNAPCOORD_DATA_DIR=/var/lib/snapcoord
RUN groupadd --system --gid 10001 snapcoord \
 && useradd --system --uid 10001 --gid snapcoord --home-dir /var/lib/snapcoord --shell /usr/sbin/nologin snapcoord \
 && install -d -o snapcoord -g snapcoord /var/lib/snapcoord
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir --no-index --find-links=/wheels snapcoord snapcoord-client \
 && rm -rf /wheels
USER 10001:10001
WORKDIR /var/lib/snapcoord
VOLUME ["/var/lib/snapcoord"]
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["snapcoord", "health", "--target", "127.0.0.1:50051"]
ENTRYPOINT ["snapcoord"]
CMD ["serve"]
