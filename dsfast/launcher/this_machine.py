"""Is a hostfile name this machine? Answered without DNS (a lookup can hang on a cluster's login node)."""
import ipaddress
import socket


def is_this_machine(host: str) -> bool:
    """True for localhost, this machine's hostname (short or full), a loopback address, or an address bound here."""
    name = host.strip().lower()
    if name in ("localhost", "localhost.localdomain"):
        return True
    own = socket.gethostname().lower()
    if name == own:
        return True
    # "node7" and "node7.cluster" name the same machine when one of the two is the short form
    if name.split(".")[0] == own.split(".")[0] and ("." not in name or "." not in own):
        return True
    try:
        addr = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    if addr.is_loopback:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:    # only an address of one of this machine's interfaces can be bound
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(addr), 0))
        return True
    except OSError:
        return False
