"""What the fleet tells Rackwise: agents' heartbeats (GPU health, silence),
topology imports, and the demo's synthetic workload."""
