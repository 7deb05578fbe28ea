"""The optional ``mooncake`` backend (``backend``), its client set-up (``client``) and a local
Mooncake master and holder for its tests and benches (``local``)."""
