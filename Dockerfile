# toolspan gateway. Without TOOLSPAN_UPSTREAM it serves the built-in scripted model and example tools.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package needs: the build context also holds .venv, tests and the stack's configs.
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY telemetry ./telemetry
RUN pip install --no-cache-dir . \
    && rm -rf /src \
    && groupadd --system --gid 10001 toolspan \
    && useradd --system --uid 10001 --gid toolspan --no-create-home --shell /usr/sbin/nologin toolspan \
    && install -d -o toolspan -g toolspan -m 0750 /var/lib/toolspan

# The trajectory store, in a directory the user owns (docker-compose.yml mounts a volume there, one
# per replica; a fresh named volume takes the directory's owner).
ENV TOOLSPAN_TRAJECTORY_STORE_PATH=/var/lib/toolspan/trajectories.sqlite3

WORKDIR /
USER 10001:10001
EXPOSE 8080

CMD ["toolspan", "serve", "--host", "0.0.0.0", "--port", "8080"]
