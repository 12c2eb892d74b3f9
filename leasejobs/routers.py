"""A database router for a queue in a database of its own (``LEASEJOBS["DATABASE"]``).

Add ``"leasejobs.routers.QueueRouter"`` to ``DATABASE_ROUTERS`` when the
queue's alias is not ``"default"``: leasejobs' models are then read and
written on that alias (the admin's pages included), and their migrations
run there only (``manage.py migrate --database ALIAS``). Other apps' models
are left to the routers after this one.
"""

from typing import Any

from django.db.models import Model

from leasejobs.conf import db_alias

APP_LABEL = "leasejobs"


class QueueRouter:
    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return db_alias() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return db_alias() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        labels = {obj1._meta.app_label, obj2._meta.app_label}
        return True if labels == {APP_LABEL} else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label == APP_LABEL:
            return db == db_alias()
        return None
