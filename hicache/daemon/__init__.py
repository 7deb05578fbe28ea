"""The cache daemon: ``hicache serve`` shares one store between engine processes over ZeroMQ."""
