"""Settings of the demo site: a small Django project that uses leasejobs.

Everything that differs between machines comes from the environment through
django-environ; the database falls back to the local server or an embedded
PostgreSQL (see ``localdb`` at the top of the repository) so that a machine with nothing but
Python can run the demo.
"""

from pathlib import Path

import environ

import localdb

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="leasejobs-demo-only-not-for-production")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "leasejobs",
    "demo_site.receipts",
    # manage.py leasejobs_bench: the benchmark, beside the library (not in its wheel).
    "bench",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "demo_site.urls"
WSGI_APPLICATION = "demo_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db_url_config(localdb.database_url())}
# Workers keep their connections: a new connection per job is what makes a
# naive Django worker slow.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DJANGO_CONN_MAX_AGE", default=600)
# Through a transaction pooler (PgBouncer, compose.yaml's worker): no
# server-side cursors, whose .iterator() spans transactions.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = env.bool(
    "DJANGO_DISABLE_SERVER_SIDE_CURSORS", default=False
)
# Let psycopg prepare Django's statements (enqueue's INSERT among them) after
# this many uses; not through a transaction pooler. Unset: Django's default.
if env.str("DJANGO_PREPARE_THRESHOLD", default=""):
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=env.int("DJANGO_PREPARE_THRESHOLD")
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".leasejobs" / "static"

LEASEJOBS = {
    "LEASE_SECONDS": env.int("LEASEJOBS_LEASE_SECONDS", default=30),
    "MAX_ATTEMPTS": env.int("LEASEJOBS_MAX_ATTEMPTS", default=5),
    # A direct connection for LISTEN when DATABASE_URL goes through a
    # transaction pooler (compose.yaml's worker); unset: the worker polls.
    "LISTEN_URL": env("LEASEJOBS_LISTEN_URL", default=None),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"leasejobs": {"handlers": ["console"], "level": env("LEASEJOBS_LOG_LEVEL", default="INFO")}},
}
