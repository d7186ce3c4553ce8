// A consume-transform-produce copier with the Java consumer's KIP-848 group protocol
// (group.protocol=consumer) and sendOffsetsToTransaction with the consumer's group metadata
// (its member id and member epoch). It copies until it has been idle for IDLE_MS, printing
// "copied N" after each committed transaction and "assigned P" on each assignment.
// Run in Java's source-file mode:
//   java -cp 'libs/*' Kip848Copier.java BOOTSTRAP GROUP SOURCE SINK TRANSACTIONAL_ID IDLE_MS

import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Kip848Copier {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], source = args[2], sink = args[3];
        long idleMs = Long.parseLong(args[5]);
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("group.id", group);
        c.put("group.protocol", "consumer");
        c.put("isolation.level", "read_committed");
        c.put("enable.auto.commit", "false");
        c.put("auto.offset.reset", "earliest");
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", args[4]);
        try (KafkaConsumer<String, String> consumer =
                new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer());
            KafkaProducer<String, String> producer =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            producer.initTransactions();
            consumer.subscribe(List.of(source), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> parts) {}

                public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                    for (TopicPartition tp : parts) {
                        System.out.println("assigned " + tp.partition());
                    }
                    System.out.flush();
                }
            });
            long copied = 0, lastRecord = System.currentTimeMillis();
            while (System.currentTimeMillis() - lastRecord < idleMs) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                lastRecord = System.currentTimeMillis();
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                producer.beginTransaction();
                try {
                    for (ConsumerRecord<String, String> r : records) {
                        producer.send(new ProducerRecord<>(sink, r.key(), r.value()));
                        next.put(new TopicPartition(r.topic(), r.partition()),
                            new OffsetAndMetadata(r.offset() + 1));
                    }
                    producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
                    producer.commitTransaction();
                    copied += records.count();
                    System.out.println("copied " + copied);
                    System.out.flush();
                } catch (KafkaException e) {
                    // A stale member epoch (the group moved on meanwhile): abort and read
                    // again from the committed offsets.
                    System.out.println("aborted " + e);
                    producer.abortTransaction();
                    Map<TopicPartition, OffsetAndMetadata> committed =
                        consumer.committed(consumer.assignment());
                    for (TopicPartition tp : consumer.assignment()) {
                        OffsetAndMetadata at = committed.get(tp);
                        consumer.seek(tp, at == null ? 0 : at.offset());
                    }
                }
            }
        }
    }
}
