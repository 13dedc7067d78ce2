"""What one client may hold of ``wheelmill index serve``, by default: apart from the server,
so that the command line reads them for its help without loading the server."""

IDLE_TIMEOUT = 30.0  # seconds an open connection may send nothing
PER_CLIENT = 16  # connections one client address may hold open at once
