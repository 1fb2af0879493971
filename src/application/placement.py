"""Placement pins, enforced: a deployment serves only streams homed (or replicated) in its
region, and delivers data only to the egress regions a stream pins."""

from __future__ import annotations

import msgspec

from domain.definition import StreamDefinition
from domain.errors import DomainError


class Misdirected(DomainError):
    code = "misdirected"


class EgressRegionDenied(DomainError):
    code = "egress-region-denied"


class Deployment(msgspec.Struct, frozen=True):
    region: str
    egress_region: str

    def serves(self, definition: StreamDefinition) -> bool:
        p = definition.placement
        return self.region == p.metadata_home or self.region in p.metadata_replicas

    def require_home(self, definition: StreamDefinition) -> None:
        if not self.serves(definition):
            home = definition.placement.metadata_home
            raise Misdirected(
                f"this deployment serves region {self.region!r}; the stream's metadata lives in "
                f"{home!r}",
                metadata_home=home,
                metadata_replicas=list(definition.placement.metadata_replicas),
            )

    def require_egress(self, definition: StreamDefinition) -> None:
        if self.egress_region not in definition.placement.client_egress_regions:
            raise EgressRegionDenied(
                f"this deployment delivers to {self.egress_region!r}, which the stream does not "
                "pin as a client egress region",
                egress_region=self.egress_region,
            )
