"""SCIM 2.0 provisioning (RFC 7643, 7644): an identity provider creates, updates and
deactivates people and their groups, and the groups' members get the memberships
``ctl auth scim map`` maps them to."""
