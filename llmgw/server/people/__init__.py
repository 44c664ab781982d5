"""People, organisations, teams, projects and who belongs where: the records
(``records.py``), what every control plane holds in memory and answers a caller from
(``directory.py``), and the services that change them, each checking the caller's right
once (``service.py`` for people and their tokens, ``orgs.py`` for organisations, teams,
projects and memberships). Knows no HTTP."""
