// A consume-transform-produce copier with the Java producer 4.x, which uses transactions
// version 2 (KIP-890 part 2) when the broker finalizes transaction.version 2: no
// AddPartitionsToTxn or AddOffsetsToTxn, EndTxn v5 bumping the epoch at every commit. Small
// transactions (max.poll.records) so that there are many. Any error (the broker killed under
// it) closes both clients and starts again from the committed offsets, as an application
// would; it prints "copied N" after each committed transaction and exits once idle IDLE_MS.
// Run in Java's source-file mode:
//   java -cp 'libs/*' Tv2Copier.java BOOTSTRAP GROUP SOURCE SINK TRANSACTIONAL_ID IDLE_MS

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

public class Tv2Copier {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], source = args[2], sink = args[3];
        long idleMs = Long.parseLong(args[5]);
        long copied = 0, lastRecord = System.currentTimeMillis();
        // Idle is counted from the first assignment on (the join may wait for a dead member).
        long[] lastAssigned = {Long.MAX_VALUE / 2};
        while (System.currentTimeMillis() - Math.max(lastRecord, lastAssigned[0]) < idleMs) {
            Properties c = new Properties();
            c.put("bootstrap.servers", bootstrap);
            c.put("group.id", group);
            c.put("isolation.level", "read_committed");
            c.put("enable.auto.commit", "false");
            c.put("auto.offset.reset", "earliest");
            c.put("max.poll.records", "10");
            // A killed instance's member leaves the group this soon (group.min.session.timeout.ms).
            c.put("session.timeout.ms", "6000");
            Properties p = new Properties();
            p.put("bootstrap.servers", bootstrap);
            p.put("transactional.id", args[4]);
            p.put("transaction.timeout.ms", "20000");
            p.put("delivery.timeout.ms", "20000");
            p.put("request.timeout.ms", "5000");
            p.put("max.block.ms", "20000");
            try (KafkaConsumer<String, String> consumer =
                    new KafkaConsumer<>(c, new StringDeserializer(), new StringDeserializer());
                KafkaProducer<String, String> producer =
                    new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
                producer.initTransactions();
                consumer.subscribe(List.of(source), new ConsumerRebalanceListener() {
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {}

                    public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                        lastAssigned[0] = System.currentTimeMillis();
                    }
                });
                while (System.currentTimeMillis() - Math.max(lastRecord, lastAssigned[0]) < idleMs) {
                    ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                    if (records.isEmpty()) {
                        continue;
                    }
                    lastRecord = System.currentTimeMillis();
                    Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                    producer.beginTransaction();
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
                }
            } catch (KafkaException e) {
                // Whatever it was, the open transaction is aborted by the next instance's
                // initTransactions (or its timeout), and the input is read again from the
                // committed offsets.
                System.out.println("restarting after " + e);
                System.out.flush();
                lastRecord = System.currentTimeMillis();
            }
        }
    }
}
