-- Run once by the postgres image on an empty data volume (docker-entrypoint-initdb.d).
-- POSTGRES_DB=mlflow creates the MLflow backend store; these are the other two.
CREATE DATABASE mlflow_auth;  -- MLflow basic-auth users and permissions
CREATE DATABASE optuna;       -- Optuna studies (nalu-sweep sweep --optuna-storage)
