"""What every settings module of the tests shares: apps, middleware, templates, time.

``tests.settings`` adds the database (found through ``localdb``) and the
LEASEJOBS, LOGGING and TASKS settings; ``tests.typecheck_settings`` adds a
database that is never connected to, for mypy's Django plugin.
"""

from pathlib import Path

#: The repository: manage.py is here (the demo's story starts workers with it).
BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "leasejobs-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "leasejobs",
    "demo_site.receipts",
    "tests.testapp",
    # manage.py leasejobs_bench (tests/integration/test_bench.py): the benchmark, beside the library.
    "bench",
    "tests.discoveryapp",
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

ROOT_URLCONF = "tests.urls"

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

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Tests log in an admin user over and over: a fast hasher (never in production).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
