"""Security, the pure parts (docs/security.md): principals and certificate names (`principal`),
JAAS config values (`jaas`), SASL per connection (`sasl`) with PLAIN (`plain`) and SCRAM
(`scram`), SCRAM credentials (`credentials`), ACLs (`acl`) and the authorizer (`authorizer`),
client quotas and connection limits (`quotas`), listeners and TLS settings (`listeners`), and the
metadata-log records of all of them (`metadata`). No I/O: clocks and randomness are passed in.
"""
