"""What a MasterService decides, as plain functions over its store: puts, removal, eviction,
recovery, offload, discarded puts, segments and clients, views. The store (store/metadata.py)
holds the state and its primitives; the service (master.py) validates, locks and calls these,
and they name it by the protocol of service.py (it sits above them)."""
