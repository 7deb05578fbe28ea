"""Page keys: the SHA-256 chain that names a page in storage and in KV events."""
