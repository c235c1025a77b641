"""The queue service: Redis Streams trajectory and prompt queues (see services/queue/store.py)."""
