"""Replaying request traces (Mooncake format) through the cache: `bench tiering --trace`."""
