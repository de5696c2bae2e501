"""Operations: admin server and status page, metrics, config files, hot reload,
warm-restart snapshots and the terminal status view."""
