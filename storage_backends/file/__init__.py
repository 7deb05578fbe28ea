"""The ``file`` backend: one file per page (``backend``)."""
