"""Signing in with an LDAP directory or Active Directory: the settings (``settings``),
one conversation with the directory server (``session``) and the service over them
(``service``) that the admin API, ``ctl auth ldap`` and the pages' sign-in call."""
