"""Cross-field check of the addresses one process listens on (part of
:mod:`sidecar.core.config_parse`): two listeners of one process on one port pass
every field check, then the second bind fails. The sidecar's ``listen.grpc`` and
``listen.admin`` stopped ``tailroute serve`` with "address already in use (another
process listens there)", the process being itself; Envoy's ``envoy.listen`` and
``envoy.admin`` rendered a bootstrap Envoy cannot start. ``check-config`` said OK."""

from __future__ import annotations

from typing import Final

from sidecar.core.config import Config
from sidecar.core.fields import ConfigReader
from sidecar.core.hostport import same_port

# (field, its address's owner) pairs bound by one process
_PAIRS: Final = (
    (("listen.grpc", "the sidecar's ext_proc gRPC"), ("listen.admin", "its admin server")),
    (("envoy.listen", "Envoy's listener"), ("envoy.admin", "its admin interface")),
)


def check_listen_ports(root: ConfigReader, cfg: Config) -> None:
    """Record a problem on the second field of each pair of listeners that would share
    a port (:func:`~sidecar.core.hostport.same_port`)."""
    addresses = {"listen.grpc": cfg.listen.grpc, "listen.admin": cfg.listen.admin,
                 "envoy.listen": cfg.envoy.listen, "envoy.admin": cfg.envoy.admin}
    for (first, first_is), (second, second_is) in _PAIRS:
        if same_port(addresses[first], addresses[second]):
            root.bad(f"{addresses[second]} takes the port of {first} "
                     f"({addresses[first]}): {first_is} and {second_is} cannot listen on "
                     "one port; give one of them another", second, None)
