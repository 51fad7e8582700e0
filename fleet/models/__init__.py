from fleet.models.actions import Action, AgentToken, ApprovalPolicy, HoldRole, NodeHold
from fleet.models.audit import AuditEvent
from fleet.models.jobs import Allocation, Job, Quota, RackReservation, Tenant
from fleet.models.metrics import FleetSample
from fleet.models.racks import GPU, GpuReading, HealthRule, Node, NodeReading, Rack
from fleet.models.webhooks import WebhookDelivery, WebhookEndpoint

__all__ = [
    "GPU",
    "Action",
    "AgentToken",
    "Allocation",
    "ApprovalPolicy",
    "AuditEvent",
    "FleetSample",
    "GpuReading",
    "HealthRule",
    "HoldRole",
    "Job",
    "Node",
    "NodeHold",
    "NodeReading",
    "Quota",
    "Rack",
    "RackReservation",
    "Tenant",
    "WebhookDelivery",
    "WebhookEndpoint",
]
