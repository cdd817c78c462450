"""Running a plan: the persistent input batch, attention metadata per KV-cache group, the forward."""
