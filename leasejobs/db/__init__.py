"""The database wing: every statement leasejobs runs (``sql``), the worker's
store and connections, and the calls made on Django's connection."""
