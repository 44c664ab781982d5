"""The nodes: what each agent reports (the registry) and the port agents keep their streams on."""
