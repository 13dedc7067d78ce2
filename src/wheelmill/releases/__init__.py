"""Releases, kept in the index's storage: their records (``records``), a release's publish of
the cells built for it and the tracks' retention (``publish``), promotion between tracks
without rebuilding (``promotion``), and the files of a channel held to their signed
provenance (``attested``) before they are installed (``preinstall``) or promoted."""
