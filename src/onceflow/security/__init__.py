"""Security as Kafka configures it: listeners, TLS, SASL (PLAIN, SCRAM) and SCRAM credentials."""
