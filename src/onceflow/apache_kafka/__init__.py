"""Apache Kafka beside onceflow: its jars fetched once with Maven (distribution) and clusters of
KRaft nodes on loopback that tests, `onceflow verify` and `onceflow bench` start and fault."""

from onceflow.apache_kafka.cluster import KafkaCluster, KafkaClusterError, KafkaNode
from onceflow.apache_kafka.distribution import Distribution, MissingTool, fetch, locate

__all__ = [
    "Distribution",
    "KafkaCluster",
    "KafkaClusterError",
    "KafkaNode",
    "MissingTool",
    "fetch",
    "locate",
]
