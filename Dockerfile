# routemaster: the wheel built from this checkout, installed on a slim Python,
# run as an unprivileged user. `docker run IMAGE` runs `serve`: the API on port
# 2017 and one worker, as 1.x's serve did. `docker run IMAGE serve --no-worker`
# runs the API alone, `docker run IMAGE cron` a worker (any number), and
# `docker run IMAGE migrate` migrates. serve stops both on SIGTERM (docker stop).
# The configuration is /etc/routemaster/config.yaml (mount yours there); the
# database is DATABASE_URL (or DB_HOST, DB_PORT, DB_NAME, DB_USER, DB_PASS).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.rst ./
COPY routemaster/ routemaster/
COPY migrations/ migrations/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /wheels/ /wheels/
RUN pip install --no-cache-dir /wheels/routemaster-*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin routemaster
COPY example.yaml /etc/routemaster/config.yaml
USER 10001
EXPOSE 2017
ENTRYPOINT ["routemaster", "-c", "/etc/routemaster/config.yaml"]
CMD ["serve"]
