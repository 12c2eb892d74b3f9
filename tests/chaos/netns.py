"""A network namespace joined to this host by a veth pair, whose link a test can cut.

The namespace is this test's own little host: 10.200.X.2 inside, 10.200.X.1
on the host side, on a /30 of the private 10.200.0.0/16 that only this pair
uses. Setting the host end down makes the namespace's end lose its carrier:
packets from the worker inside go nowhere and get no answer, as when a cable
is pulled or a switch dies, and nothing tells either side. Setting it up
again lets TCP's retransmissions through, and the same connections carry on.
"""

import random
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class CannotMakeNamespace(Exception):
    """This machine cannot make a network namespace (the reason is the message)."""


@dataclass(frozen=True)
class Namespace:
    name: str
    host_link: str
    host_address: str
    address: str
    subnet: str

    @property
    def exec_prefix(self) -> list[str]:
        """Run a command inside (``ip netns exec`` execs it: its pid is the command's)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _ip("link", "set", self.host_link, "down")

    def restore(self) -> None:
        _ip("link", "set", self.host_link, "up")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise CannotMakeNamespace(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


@contextmanager
def network_namespace() -> Iterator[Namespace]:
    """Make a namespace and its veth pair; remove both however the test ends."""
    tag = secrets.token_hex(3)
    octet = random.randrange(256)
    ns = Namespace(
        name=f"leasejobs-chaos-{tag}",
        host_link=f"ljc{tag}h",
        host_address=f"10.200.{octet}.1",
        address=f"10.200.{octet}.2",
        subnet=f"10.200.{octet}.0/30",
    )
    inside = f"ljc{tag}n"
    try:
        _ip("netns", "add", ns.name)
    except (CannotMakeNamespace, OSError) as exc:
        raise CannotMakeNamespace(f"cannot make a network namespace on this machine: {exc}") from exc
    try:
        _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", inside, "netns", ns.name)
        _ip("addr", "add", f"{ns.host_address}/30", "dev", ns.host_link)
        _ip("link", "set", ns.host_link, "up")
        _ip("-n", ns.name, "addr", "add", f"{ns.address}/30", "dev", inside)
        _ip("-n", ns.name, "link", "set", inside, "up")
        _ip("-n", ns.name, "link", "set", "lo", "up")
        yield ns
    finally:
        # Deleting one end of a veth pair deletes both.
        subprocess.run(["ip", "link", "del", ns.host_link], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True, timeout=10)
