"""The KV event Structs of peer projects, declared field for field and option
for option as each declares them, so that decoding with them proves a router
of that project reads what hicache publishes. Each module names its source."""
