"""Who may do what on the broker: TLS, SASL, authorization, quotas, internal topics, the inter-broker
principal and the security records followed from the controller."""
