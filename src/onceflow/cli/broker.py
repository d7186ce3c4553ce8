"""`onceflow broker`: run the embedded Kafka-protocol broker in the foreground."""
# Placeholder owned by the broker work; replaced by the real command.
