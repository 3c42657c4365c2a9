"""Every aggregate of the domain. Importing this module registers every aggregate and event
topic, so stored events can be decoded (the store imports it; nothing light should)."""

from better_compute.domain.bookings import NodeBookings
from better_compute.domain.gpu_claims import GpuClaim
from better_compute.domain.join_token import JoinToken
from better_compute.domain.node import Node
from better_compute.domain.pki import PkiBundle
from better_compute.domain.pool import Pool
from better_compute.domain.quota import QuotaUse
from better_compute.domain.reservation import Reservation
from better_compute.domain.site import Site
from better_compute.domain.tenant import Tenant
from better_compute.domain.token import ApiToken

AGGREGATES = (
    Tenant, ApiToken, Site, Pool, PkiBundle, JoinToken, Node, Reservation, NodeBookings,
    QuotaUse, GpuClaim,
)

__all__ = [
    "AGGREGATES", "ApiToken", "GpuClaim", "JoinToken", "Node", "NodeBookings", "PkiBundle", "Pool",
    "QuotaUse", "Reservation", "Site", "Tenant",
]
