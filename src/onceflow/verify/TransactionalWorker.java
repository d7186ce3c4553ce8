// One transactional client process of `onceflow verify --client java`: the producer or the
// consume-transform-produce copier of verify/workload.py, played by Kafka's Java client, which
// uses transactions version 2 (KIP-890 part 2) when the broker finalizes it. It takes the same
// JSON argument as `python -m onceflow.verify.worker` ({"worker": WorkerSpec, "workload":
// WorkloadSpec}) and writes the same operations as JSON lines on stdout (one write a line, so a
// SIGKILL leaves at most a torn last line); SIGTERM finishes the current operation and exits 0,
// SIGSTOP/SIGKILL need nothing. Exit 3: the client could not get back to a working state.
// Compiled by the run (verify/java_worker.py: javac -cp 'libs/*'), then run with its classes
// before Kafka's jars: java -cp 'classes:libs/*' TransactionalWorker JSON

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.function.Supplier;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import sun.misc.Signal;

public class TransactionalWorker {
    static final int EXIT_CLIENT_ERROR = 3;
    static final String INVOKE = "invoke", OK = "ok", FAIL = "fail", UNKNOWN = "unknown";
    static final String INFO = "info", TXN = "txn", TXN_END = "txn-end", WORKER = "worker";
    static final String COMMIT = "commit", ABORT = "abort";
    static final String COPY_MARK = ">", ID_HEADER = "id";
    static final ObjectMapper JSON = new ObjectMapper();
    static volatile boolean stop = false;

    public static void main(String[] args) throws Exception {
        // Kafka's logging (log4j's default console appender) must not mix into the operations.
        System.setOut(System.err);
        if (args.length != 1) {
            System.err.println("usage: java -cp 'classes:libs/*' TransactionalWorker JSON");
            System.exit(2);
        }
        JsonNode config = JSON.readTree(args[0]);
        Spec spec = new Spec(config.get("worker"));
        Workload workload = new Workload(config.get("workload"));
        Signal.handle(new Signal("TERM"), signal -> stop = true);
        Ops ops = new Ops();
        ops.emit(INFO, WORKER, obj("event", "started", "role", spec.role, "client", "java"));
        int code = 0;
        try {
            switch (spec.role) {
                case "producer" -> runProducer(spec, workload, ops);
                case "copier" -> runCopier(spec, workload, ops);
                default -> {
                    System.err.println("the Java worker plays producer and copier, not " + spec.role);
                    code = 2;
                }
            }
        } catch (ClientError e) {
            ops.emit(INFO, WORKER, obj("event", "gave-up", "error", e.getMessage()));
            code = EXIT_CLIENT_ERROR;
        }
        System.exit(code);
    }

    // -- specs -------------------------------------------------------------------------------

    /** WorkerSpec (workload.py): one client process. */
    static final class Spec {
        final String role, bootstrap, name, process;
        final long seed;
        final Map<String, String> settings = new LinkedHashMap<>();

        Spec(JsonNode node) {
            role = node.get("role").asText();
            bootstrap = node.get("bootstrap").asText();
            seed = node.get("seed").asLong();
            // Only writers come here: the name is the transactional.id, as WorkerSpec.name.
            name = role + node.get("slot").asInt();
            process = name + "#" + node.get("incarnation").asInt();
            node.path("settings").properties().forEach(e -> settings.put(e.getKey(), e.getValue().asText()));
        }
    }

    /** WorkloadSpec (workload.py): what the clients do. */
    static final class Workload {
        final List<TopicPartition> dataPartitions = new ArrayList<>();
        final String copyInput, copyOutput, copyGroup, groupProtocol;
        final int copyOutputPartitions, maxPartitionsPerTxn, maxValuesPerPartition;
        final int keysPerPartition, transactionTimeoutMs;
        final double abortRatio, copyAbortRatio, tombstoneRatio;

        Workload(JsonNode node) {
            // Python's dicts keep their order, and so does Jackson: the first topic is the input.
            String first = null;
            for (Map.Entry<String, JsonNode> topic : node.get("topics").properties()) {
                first = first == null ? topic.getKey() : first;
                for (int p = 0; p < topic.getValue().asInt(); p++) {
                    dataPartitions.add(new TopicPartition(topic.getKey(), p));
                }
            }
            copyInput = first;
            copyOutput = node.get("copy_output").asText();
            copyOutputPartitions = node.get("copy_output_partitions").asInt();
            copyGroup = node.get("copy_group").asText();
            groupProtocol = node.path("group_protocol").asText("classic");
            abortRatio = node.get("abort_ratio").asDouble();
            copyAbortRatio = node.get("copy_abort_ratio").asDouble();
            maxPartitionsPerTxn = node.get("max_partitions_per_txn").asInt();
            maxValuesPerPartition = node.get("max_values_per_partition").asInt();
            keysPerPartition = node.path("keys_per_partition").asInt(0);
            tombstoneRatio = node.path("tombstone_ratio").asDouble(0.0);
            transactionTimeoutMs = node.get("transaction_timeout_ms").asInt();
        }

        int requestTimeoutMs() {
            // Short, so that a paused broker or a black-holed connection trips it (as workload.py).
            return Math.min(6000, transactionTimeoutMs);
        }
    }

    static final class ClientError extends Exception {
        ClientError(String message, Throwable cause) {
            super(message, cause);
        }
    }

    // -- the operation stream ----------------------------------------------------------------

    /** Operations as JSON lines on fd 1, each in one write (OpStream in workload.py). */
    static final class Ops {
        private final FileOutputStream out = new FileOutputStream(FileDescriptor.out);

        synchronized void emit(String type, String f, ObjectNode value) {
            ObjectNode line = JSON.createObjectNode();
            line.put("type", type);
            line.put("f", f);
            line.set("value", value);
            // CLOCK_MONOTONIC, as Python's time.monotonic(): the harness orders both by it.
            line.put("at", System.nanoTime() / 1e9);
            try {
                byte[] text = (JSON.writeValueAsString(line) + "\n").getBytes(StandardCharsets.UTF_8);
                out.write(text);
            } catch (IOException e) {
                // The harness is gone (a broken pipe): nobody reads what this process does.
                Runtime.getRuntime().halt(1);
            }
        }
    }

    static ObjectNode obj(Object... pairs) {
        ObjectNode node = JSON.createObjectNode();
        for (int i = 0; i < pairs.length; i += 2) {
            node.set((String) pairs[i], JSON.valueToTree(pairs[i + 1]));
        }
        return node;
    }

    static ArrayNode row(Object... items) {
        ArrayNode node = JSON.createArrayNode();
        for (Object item : items) {
            node.add(JSON.valueToTree(item));
        }
        return node;
    }

    static String describe(Throwable e) {
        String text = e.getClass().getSimpleName() + ": " + e.getMessage();
        return e.getCause() != null && e.getCause() != e ? text + " (" + describe(e.getCause()) + ")" : text;
    }

    static void sleepMs(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static Properties baseConfig(Spec spec, Workload workload) {
        int requestTimeoutMs = workload.requestTimeoutMs();
        Properties p = new Properties();
        p.put("bootstrap.servers", spec.bootstrap);
        p.put("client.id", spec.process);
        p.put("reconnect.backoff.ms", "50");
        p.put("reconnect.backoff.max.ms", "500");
        p.put("retry.backoff.ms", "50");
        p.put("retry.backoff.max.ms", "500");
        p.put("request.timeout.ms", String.valueOf(requestTimeoutMs));
        p.put("socket.connection.setup.timeout.ms", String.valueOf(requestTimeoutMs));
        p.put("socket.connection.setup.timeout.max.ms", String.valueOf(requestTimeoutMs));
        p.putAll(spec.settings);
        return p;
    }

    // -- the transactional client --------------------------------------------------------------

    /** One write of a transaction; `key` is null unless keyed (the compacted workload). */
    record Write(String topic, int partition, String value, String key, boolean tombstone) {}

    /** A transactional producer that an application keeps working through faults: retriable
     *  errors are retried, abortable ones aborted, and after a fatal one (fenced, or a
     *  transaction the broker timed out) a new instance with the same transactional.id fences
     *  the old (TransactionalClient in workload.py). */
    static final class TransactionalClient {
        final Spec spec;
        final Ops ops;
        final Properties config;
        final long callTimeoutMs;
        KafkaProducer<byte[], byte[]> producer;
        int instance = 0;

        TransactionalClient(Spec spec, Workload workload, Ops ops) {
            this.spec = spec;
            this.ops = ops;
            callTimeoutMs = Math.max(5000, workload.transactionTimeoutMs);
            int requestTimeoutMs = workload.requestTimeoutMs();
            config = baseConfig(spec, workload);
            config.put("transactional.id", spec.name);
            config.put("transaction.timeout.ms", String.valueOf(workload.transactionTimeoutMs));
            config.put("linger.ms", "5");
            // Bounds initTransactions, sendOffsetsToTransaction and commit/abort (the Python
            // client's call timeout), and flush through the delivery timeout.
            config.put("max.block.ms", String.valueOf(callTimeoutMs));
            config.put("delivery.timeout.ms", String.valueOf(Math.max(callTimeoutMs, requestTimeoutMs + 5)));
            config.putAll(spec.settings);
        }

        /** An initialised producer (InitProducerId done), made anew after a fatal error. */
        KafkaProducer<byte[], byte[]> ensure() throws ClientError {
            long deadline = System.nanoTime() + 120_000_000_000L;
            while (producer == null) {
                instance++;
                KafkaProducer<byte[], byte[]> made;
                try {
                    made = new KafkaProducer<>(config, new ByteArraySerializer(), new ByteArraySerializer());
                } catch (KafkaException e) {
                    throw new ClientError("cannot create the producer: " + describe(e), e);
                }
                while (true) {
                    try {
                        made.initTransactions();
                        producer = made;
                        break;
                    } catch (RuntimeException e) {
                        ops.emit(INFO, WORKER, obj("event", "init-failed", "error", describe(e)));
                        if (System.nanoTime() > deadline || stop) {
                            closeQuietly(made);
                            throw new ClientError("initTransactions keeps failing: " + describe(e), e);
                        }
                        if (!(e instanceof RetriableException)) {
                            closeQuietly(made);
                            break; // a new instance
                        }
                        sleepMs(200);
                    }
                }
            }
            return producer;
        }

        static void closeQuietly(KafkaProducer<byte[], byte[]> p) {
            try {
                p.close(Duration.ZERO);
            } catch (RuntimeException e) {
                // closing a broken producer: nothing more to do with it
            }
        }

        /** Drop the producer; the next ensure() creates one whose InitProducerId fences it. */
        void replace() {
            if (producer != null) {
                closeQuietly(producer);
            }
            producer = null;
        }

        /** Run one transaction, record it (invoke, txn-end, completion), return its outcome. */
        String transaction(
                String txn,
                String intent,
                List<Write> writes,
                Map<TopicPartition, OffsetAndMetadata> offsets,
                Supplier<ConsumerGroupMetadata> groupMetadata,
                ObjectNode extra)
                throws ClientError {
            KafkaProducer<byte[], byte[]> p = ensure();
            List<ArrayNode> delivered = Collections.synchronizedList(new ArrayList<>());
            List<String> refused = Collections.synchronizedList(new ArrayList<>());
            ArrayNode plannedWrites = JSON.createArrayNode();
            ObjectNode keys = JSON.createObjectNode();
            for (Write w : writes) {
                plannedWrites.add(row(w.topic, w.partition, w.value));
                if (w.key != null) {
                    keys.set(w.value, row(w.key, w.tombstone));
                }
            }
            ObjectNode invoke = obj("txn", txn, "intent", intent);
            invoke.set("writes", plannedWrites);
            if (!keys.isEmpty()) {
                invoke.set("keys", keys);
            }
            if (extra != null) {
                invoke.setAll(extra);
            }
            ops.emit(INVOKE, TXN, invoke);
            boolean commitRequested = false;
            try {
                p.beginTransaction();
                for (Write w : writes) {
                    send(p, w, delivered, refused);
                }
                p.flush();
                if (offsets != null) {
                    p.sendOffsetsToTransaction(offsets, groupMetadata.get());
                }
                ops.emit(INFO, TXN_END, withDelivered(obj("txn", txn, "end", intent), delivered));
                commitRequested = intent.equals(COMMIT);
                end(p, commitRequested);
                String outcome = commitRequested ? OK : FAIL;
                ObjectNode done = withDelivered(obj("txn", txn), delivered);
                done.set("error", commitRequested ? null : JSON.valueToTree("aborted on purpose"));
                ops.emit(outcome, TXN, done);
                return outcome;
            } catch (RuntimeException e) {
                RuntimeException error = e;
                // An abortable error is aborted and the producer kept; after a fatal one (or a
                // commit that timed out for good) abortTransaction throws, and so we know.
                try {
                    end(p, false);
                    ops.emit(FAIL, TXN, withDelivered(obj("txn", txn, "error", describe(error)), delivered));
                    return FAIL;
                } catch (RuntimeException e2) {
                    error = e2;
                }
                // Without a successful commit or abort the outcome is decided by the broker (the
                // next instance's InitProducerId, or the transaction timeout): unknown if the
                // commit was requested, else certainly not committed.
                String outcome = commitRequested ? UNKNOWN : FAIL;
                String detail = describe(error);
                synchronized (refused) {
                    if (!refused.isEmpty()) {
                        detail += "; refused: " + refused.subList(0, Math.min(3, refused.size()));
                    }
                }
                ops.emit(outcome, TXN, withDelivered(obj("txn", txn, "error", detail), delivered));
                replace();
                return outcome;
            }
        }

        static ObjectNode withDelivered(ObjectNode value, List<ArrayNode> delivered) {
            ArrayNode list = JSON.createArrayNode();
            synchronized (delivered) {
                list.addAll(delivered);
            }
            value.set("delivered", list);
            return value;
        }

        static void send(KafkaProducer<byte[], byte[]> p, Write w, List<ArrayNode> delivered, List<String> refused) {
            RecordHeaders headers = new RecordHeaders();
            if (w.tombstone) { // a null value: the record is named by its header
                headers.add(ID_HEADER, w.value.getBytes(StandardCharsets.UTF_8));
            }
            byte[] key = w.key == null ? null : w.key.getBytes(StandardCharsets.UTF_8);
            byte[] value = w.tombstone ? null : w.value.getBytes(StandardCharsets.UTF_8);
            // The value written, not the record's: a tombstone is named by its header.
            p.send(new ProducerRecord<>(w.topic, w.partition, key, value, headers), (metadata, error) -> {
                if (error == null) {
                    delivered.add(row(metadata.topic(), metadata.partition(), metadata.offset(), w.value));
                } else {
                    refused.add(w.value + ": " + describe(error));
                }
            });
        }

        /** commitTransaction / abortTransaction, called again after a timeout (Kafka's
         *  producer then awaits the same pending end), for at most 6 call timeouts. */
        void end(KafkaProducer<byte[], byte[]> p, boolean commit) {
            long deadline = System.nanoTime() + 6 * callTimeoutMs * 1_000_000L;
            while (true) {
                try {
                    if (commit) {
                        p.commitTransaction();
                    } else {
                        p.abortTransaction();
                    }
                    return;
                } catch (TimeoutException e) {
                    if (System.nanoTime() > deadline) {
                        throw e;
                    }
                }
            }
        }

        void close() {
            if (producer != null) {
                try {
                    producer.close(Duration.ofSeconds(5));
                } catch (RuntimeException e) {
                    // the run is over for this client
                }
                producer = null;
            }
        }
    }

    static Random random(Spec spec) {
        return new Random((spec.seed + "/" + spec.process).hashCode());
    }

    // -- roles -----------------------------------------------------------------------------------

    /** Transactions of unique values over several partitions of several topics, some aborted on
     *  purpose; keyed (with tombstones) in the compacted workload (run_producer). */
    static void runProducer(Spec spec, Workload workload, Ops ops) throws ClientError {
        Random rng = random(spec);
        TransactionalClient client = new TransactionalClient(spec, workload, ops);
        List<TopicPartition> partitions = workload.dataPartitions;
        int number = 0;
        while (!stop) {
            number++;
            String txn = spec.process + "." + number;
            List<TopicPartition> shuffled = new ArrayList<>(partitions);
            Collections.shuffle(shuffled, rng);
            int count = 1 + rng.nextInt(Math.min(workload.maxPartitionsPerTxn, partitions.size()));
            List<Write> writes = new ArrayList<>();
            for (TopicPartition tp : shuffled.subList(0, count)) {
                int values = 1 + rng.nextInt(workload.maxValuesPerPartition);
                for (int i = 0; i < values; i++) {
                    if (workload.keysPerPartition > 0) {
                        // A key belongs to one partition (its name says which), as keyed_writes.
                        String key = "k" + tp.partition() + "-" + rng.nextInt(workload.keysPerPartition);
                        boolean tombstone = rng.nextDouble() < workload.tombstoneRatio;
                        String value = txn + "." + key + "." + i + (tombstone ? ".tombstone" : "");
                        writes.add(new Write(tp.topic(), tp.partition(), value, key, tombstone));
                    } else {
                        String topic = tp.topic();
                        String value = txn + "." + topic.charAt(topic.length() - 1) + tp.partition() + "." + i;
                        writes.add(new Write(topic, tp.partition(), value, null, false));
                    }
                }
            }
            String intent = rng.nextDouble() < workload.abortRatio ? ABORT : COMMIT;
            client.transaction(txn, intent, writes, null, null, null);
            sleepMs(rng.nextInt(50));
        }
        client.close();
    }

    /** Consume-transform-produce: reads the input read_committed in the copiers' group, writes
     *  one copy of each value and commits the consumed offsets in the same transaction
     *  (sendOffsetsToTransaction with the consumer's group metadata) (run_copier). */
    static void runCopier(Spec spec, Workload workload, Ops ops) throws ClientError {
        Random rng = random(spec);
        TransactionalClient client = new TransactionalClient(spec, workload, ops);
        Properties c = baseConfig(spec, workload);
        c.put("group.id", workload.copyGroup);
        c.put("group.protocol", workload.groupProtocol);
        c.put("isolation.level", "read_committed");
        c.put("enable.auto.commit", "false");
        c.put("auto.offset.reset", "earliest");
        if (workload.groupProtocol.equals("classic")) {
            // The consumer protocol takes its session and heartbeat settings from the broker.
            c.put("session.timeout.ms", "6000");
            c.put("heartbeat.interval.ms", "1000");
        }
        c.put("max.poll.interval.ms", "60000");
        c.put("max.poll.records", "100");
        c.putAll(spec.settings);
        KafkaConsumer<byte[], byte[]> consumer;
        try {
            consumer = new KafkaConsumer<>(c, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        } catch (KafkaException e) {
            throw new ClientError("cannot create the consumer: " + describe(e), e);
        }
        consumer.subscribe(List.of(workload.copyInput));
        int number = 0;
        try {
            while (!stop) {
                client.ensure();
                ConsumerRecords<byte[], byte[]> polled;
                try {
                    polled = consumer.poll(Duration.ofMillis(500));
                } catch (KafkaException e) {
                    ops.emit(INFO, WORKER, obj("event", "consume-error", "error", describe(e)));
                    continue;
                }
                List<ConsumerRecord<byte[], byte[]>> got = take(consumer, polled, 1 + rng.nextInt(100));
                if (got.isEmpty()) {
                    continue;
                }
                number++;
                String txn = spec.process + "." + number;
                ArrayNode reads = JSON.createArrayNode();
                Map<TopicPartition, Long> next = new LinkedHashMap<>();
                List<Write> writes = new ArrayList<>();
                for (ConsumerRecord<byte[], byte[]> r : got) {
                    String value = r.value() == null ? "" : new String(r.value(), StandardCharsets.UTF_8);
                    reads.add(row(r.topic(), r.partition(), r.offset(), value));
                    next.merge(new TopicPartition(r.topic(), r.partition()), r.offset() + 1, Long::max);
                    int out = r.partition() % workload.copyOutputPartitions;
                    writes.add(new Write(workload.copyOutput, out, value + COPY_MARK + txn, null, false));
                }
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                ArrayNode offsetRows = JSON.createArrayNode();
                next.forEach((tp, offset) -> {
                    offsets.put(tp, new OffsetAndMetadata(offset));
                    offsetRows.add(row(tp.topic(), tp.partition(), offset));
                });
                String intent = rng.nextDouble() < workload.copyAbortRatio ? ABORT : COMMIT;
                ObjectNode extra = JSON.createObjectNode();
                extra.set("reads", reads);
                extra.set("offsets", offsetRows);
                extra.put("group", workload.copyGroup);
                String outcome = client.transaction(txn, intent, writes, offsets, consumer::groupMetadata, extra);
                if (!outcome.equals(OK)) {
                    rewind(consumer, ops);
                }
            }
        } finally {
            try {
                consumer.close(CloseOptions.timeout(Duration.ofSeconds(5)));
            } catch (RuntimeException e) {
                // leaving the group is best effort: the session timeout removes the member
            }
            client.close();
        }
    }

    /** The first `limit` records of a poll (transactions of 1 to 100 records, as the Python
     *  copier's consume(n)); each partition whose records were not all taken is sought back to
     *  its first one left, so that the next poll returns it again. */
    static List<ConsumerRecord<byte[], byte[]>> take(
            KafkaConsumer<byte[], byte[]> consumer, ConsumerRecords<byte[], byte[]> polled, int limit) {
        List<ConsumerRecord<byte[], byte[]>> got = new ArrayList<>();
        Map<TopicPartition, Long> leftFrom = new LinkedHashMap<>();
        for (ConsumerRecord<byte[], byte[]> r : polled) {
            if (got.size() < limit) {
                got.add(r);
            } else {
                leftFrom.putIfAbsent(new TopicPartition(r.topic(), r.partition()), r.offset());
            }
        }
        leftFrom.forEach(consumer::seek);
        return got;
    }

    /** After a transaction that did not commit (or may not have), go back to the group's
     *  committed offsets, so that what it consumed is consumed again (rewind). */
    static void rewind(KafkaConsumer<byte[], byte[]> consumer, Ops ops) throws ClientError {
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            Set<TopicPartition> assignment = consumer.assignment();
            try {
                if (!assignment.isEmpty()) {
                    Map<TopicPartition, OffsetAndMetadata> committed =
                            consumer.committed(assignment, Duration.ofSeconds(10));
                    for (TopicPartition tp : assignment) {
                        OffsetAndMetadata at = committed.get(tp);
                        if (at == null) {
                            consumer.seekToBeginning(List.of(tp));
                        } else {
                            consumer.seek(tp, at);
                        }
                    }
                }
                return;
            } catch (KafkaException e) {
                ops.emit(INFO, WORKER, obj("event", "rewind-failed", "error", describe(e)));
                if (System.nanoTime() > deadline) {
                    throw new ClientError("cannot rewind to the committed offsets: " + describe(e), e);
                }
                sleepMs(200);
            }
        }
    }
}
