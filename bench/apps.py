"""App configuration of the benchmark: installing it adds ``manage.py leasejobs_bench``."""

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "bench"
    verbose_name = "leasejobs benchmark"
