#!/bin/sh
# Start the MLflow tracking server with basic auth and proxied artifacts.
# Everything secret comes from the environment (docker-compose.yml, from .env); the auth
# config is written to a private file at start and never baked into the image.
set -eu
: "${MLFLOW_BACKEND_STORE_URI:?}" "${MLFLOW_AUTH_DATABASE_URI:?}" "${MLFLOW_AUTH_ADMIN_PASSWORD:?}"
: "${MLFLOW_FLASK_SERVER_SECRET_KEY:?}"
umask 077
conf="$(mktemp -d)/basic_auth.ini"
cat > "$conf" <<INI
[mlflow]
default_permission = READ
database_uri = ${MLFLOW_AUTH_DATABASE_URI}
admin_username = ${MLFLOW_AUTH_ADMIN_USERNAME:-admin}
INI
export MLFLOW_AUTH_CONFIG_PATH="$conf"
exec mlflow server \
    --app-name basic-auth \
    --backend-store-uri "$MLFLOW_BACKEND_STORE_URI" \
    --serve-artifacts \
    --artifacts-destination "${MLFLOW_ARTIFACTS_DESTINATION:-/mlflow/artifacts}" \
    --host 0.0.0.0 \
    --port 5000 \
    --workers "${MLFLOW_WORKERS:-2}" \
    --allowed-hosts "${MLFLOW_ALLOWED_HOSTS:-mlflow,mlflow:5000,localhost,localhost:5000,127.0.0.1,127.0.0.1:5000}"
