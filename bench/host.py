"""What the host does to this machine's figures: the CPU time it takes (steal).

Standard library only, so that ``bench/compare/compare.py``, which runs in a
virtualenv of its own without Django, reads it the same way.
"""

#: A share of the CPU taken by the host worth showing beside a figure.
STEAL_SHOWN = 0.02


def cpu_ticks() -> tuple[int, int] | None:
    """(ticks stolen by the hypervisor, all ticks) of every CPU so far, from Linux's ``/proc/stat``.

    On a virtual machine the host may run something else on this machine's
    CPUs for a while ("steal"), and every figure of that moment drops with
    it. None where there is no ``/proc/stat``.
    """
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPU time the host took between two ``cpu_ticks()`` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])
