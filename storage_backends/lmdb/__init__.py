"""The ``lmdb`` backend (``backend``: pages in one LMDB environment) and the LMDB machinery the
``disk`` backend's index shares: opening an environment (``env``), the structural check in a child
process (``check``, ``pages``) and the clean-close marker (``clean``)."""
