"""High availability: the oplog wire model, its durable stores and the ordered writer."""
