// A consumer group's offsets in the target cluster as MirrorMaker 2's own client library reads
// them from `{alias}.checkpoints.internal`: one line per partition, "topic partition offset".
// Run in Java's source-file mode: java -cp 'mirror-maker-libs/*' RemoteOffsets.java BOOTSTRAP ALIAS GROUP

import java.time.Duration;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.connect.mirror.RemoteClusterUtils;

public class RemoteOffsets {
    public static void main(String[] args) throws Exception {
        Map<String, Object> client = Map.of("bootstrap.servers", args[0]);
        Map<TopicPartition, OffsetAndMetadata> offsets =
            RemoteClusterUtils.translateOffsets(client, args[1], args[2], Duration.ofSeconds(60));
        Map<String, Long> sorted = new TreeMap<>();
        offsets.forEach((tp, om) -> sorted.put(tp.topic() + " " + tp.partition(), om.offset()));
        sorted.forEach((tp, offset) -> System.out.println(tp + " " + offset));
    }
}
