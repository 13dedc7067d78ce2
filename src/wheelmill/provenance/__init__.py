"""What a wheel is made of and who made it: the record of a build's inputs (``record``), the
PEP 770 SBOM written into the wheel from it (``sbom``), the in-toto statement with a SLSA
provenance predicate made from it (``statement``), signed in a DSSE envelope (``signing``),
and their verification against a file, a page and the team's keys (``verification``)."""

import logging

# cyclonedx's serializer logs each class it registers, at import, at debug level: where a
# host (nox) shows the root logger's debug lines, that would be hundreds of lines of stderr.
logging.getLogger("py_serializable").propagate = False
