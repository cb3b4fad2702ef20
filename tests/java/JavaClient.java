// kafka-delay used from the official Java client (kafka-clients), as a user would: run by
// tests/apache_kafka.rs with `java -cp <Kafka's classpath> JavaClient.java BOOTSTRAP DELAY TARGET N`.
//
// 1. Produces N keyed records to the delay topic DELAY, due 2 s later on TARGET.
// 2. Consumes TARGET and checks that every record arrived once, no earlier than due, with its
//    value, on the partition the Java client's own partitioner picks for its key.
// 3. Retries one consumed record with the README's Java snippet (between the README markers
//    below, checked against README.md by the test) and checks that it comes back counted.
// Prints one summary line per check and exits 0 only when all hold.
import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.internals.BuiltInPartitioner;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaClient {
    static void fail(String why) {
        System.out.println("FAIL " + why);
        System.exit(1);
    }

    static String header(ConsumerRecord<byte[], byte[]> rec, String name) {
        Header h = rec.headers().lastHeader(name);
        return h == null || h.value() == null ? null : new String(h.value(), UTF_8);
    }

    /** The README's retry snippet, as written there. */
    static void retry(ConsumerRecord<byte[], byte[]> rec, Producer<byte[], byte[]> producer) {
        // README java-retry begin
        ProducerRecord<byte[], byte[]> retry = new ProducerRecord<>("delay.retry", rec.key(), rec.value());
        rec.headers().forEach(h -> { if (!h.key().startsWith("delay-")) retry.headers().add(h); });
        retry.headers().add("delay-target", rec.topic().getBytes(UTF_8));
        retry.headers().add("retry-after", "30".getBytes(UTF_8));
        producer.send(retry);
        // README java-retry end
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], delayTopic = args[1], target = args[2];
        int n = Integer.parseInt(args[3]);

        Properties pc = new Properties();
        pc.put("bootstrap.servers", bootstrap);
        pc.put("key.serializer", ByteArraySerializer.class.getName());
        pc.put("value.serializer", ByteArraySerializer.class.getName());
        pc.put("linger.ms", "5");
        Properties cc = new Properties();
        cc.put("bootstrap.servers", bootstrap);
        cc.put("key.deserializer", ByteArrayDeserializer.class.getName());
        cc.put("value.deserializer", ByteArrayDeserializer.class.getName());
        cc.put("enable.auto.commit", "false");

        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pc);
             KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cc)) {
            List<TopicPartition> parts = new ArrayList<>();
            consumer.partitionsFor(target).forEach(p -> parts.add(new TopicPartition(target, p.partition())));
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            int partitions = parts.size();

            long dueMs = System.currentTimeMillis() + 2_000;
            for (int i = 0; i < n; i++) {
                ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(delayTopic,
                        ("customer-" + i).getBytes(UTF_8), ("order of customer-" + i).getBytes(UTF_8));
                rec.headers().add("delay-target", target.getBytes(UTF_8));
                rec.headers().add("delay-until", Long.toString(dueMs).getBytes(UTF_8));
                rec.headers().add("trace-id", ("t" + i).getBytes(UTF_8));
                producer.send(rec);
            }
            producer.flush();
            System.out.println("produced " + n + " delayed records to " + delayTopic);

            Map<String, Integer> seen = new HashMap<>();
            ConsumerRecord<byte[], byte[]> toRetry = null;
            int misplaced = 0, early = 0, wrong = 0;
            long deadline = System.currentTimeMillis() + 120_000;
            while (seen.size() < n && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(200))) {
                    String key = new String(rec.key(), UTF_8);
                    if (!key.startsWith("customer-")) continue;
                    seen.merge(key, 1, Integer::sum);
                    int javaPartition = BuiltInPartitioner.partitionForKey(rec.key(), partitions);
                    if (rec.partition() != javaPartition) misplaced++;
                    if (Long.parseLong(header(rec, "delay-fired-ms")) < dueMs) early++;
                    String i = key.substring("customer-".length());
                    if (!new String(rec.value(), UTF_8).equals("order of " + key)
                            || !("t" + i).equals(header(rec, "trace-id"))) wrong++;
                    if (toRetry == null) toRetry = rec;
                }
            }
            long duplicates = seen.values().stream().filter(c -> c > 1).count();
            System.out.printf("received %d of %d keys on %d partitions: %d misplaced, %d early, %d altered, %d duplicated%n",
                    seen.size(), n, partitions, misplaced, early, wrong, duplicates);
            if (seen.size() != n || misplaced != 0 || early != 0 || wrong != 0 || duplicates != 0) fail("delivery");
            System.out.println("placement agrees with the Java client's partitioner on " + n + " keys");

            // Retry one record with the README snippet; it comes back in 30 s as attempt 1.
            long sentMs = System.currentTimeMillis();
            retry(toRetry, producer);
            producer.flush();
            String retried = new String(toRetry.key(), UTF_8);
            ConsumerRecord<byte[], byte[]> back = null;
            deadline = System.currentTimeMillis() + 90_000;
            while (back == null && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> rec : consumer.poll(Duration.ofMillis(200))) {
                    if (retried.equals(new String(rec.key(), UTF_8)) && header(rec, "retry-attempt") != null) back = rec;
                }
            }
            if (back == null) fail("the retried record did not come back within 90 s");
            long waited = System.currentTimeMillis() - sentMs;
            long due = Long.parseLong(header(back, "delay-due-ms"));
            System.out.printf("retry came back after %d ms: retry-attempt=%s, trace-id=%s, due %d ms after the retry was produced%n",
                    waited, header(back, "retry-attempt"), header(back, "trace-id"), due - sentMs);
            if (!"1".equals(header(back, "retry-attempt"))) fail("retry-attempt");
            if (!header(toRetry, "trace-id").equals(header(back, "trace-id"))) fail("headers not copied");
            if (due < sentMs + 29_000 || Long.parseLong(header(back, "delay-fired-ms")) < due) fail("retried early");
            System.out.println("OK");
        }
    }
}
